import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedsim.core.aggregate import weighted_average
from fedsim.client.resident import BoundLayout
from fedsim.models import build_model
from fedsim.models.state import layout_of, pack


def test_weights_are_sample_count_proportional():
    a, b, c = np.full(3, 1.0, np.float32), np.full(3, 2.0, np.float32), np.full(3, 4.0, np.float32)
    out = weighted_average([(0, 10, a), (1, 30, b), (2, 60, c)])
    np.testing.assert_allclose(out, (10 * 1 + 30 * 2 + 60 * 4) / 100)
    assert out.dtype == np.float32


def test_average_independent_of_arrival_order():
    rng = np.random.default_rng(0)
    ups = [(i, int(rng.integers(1, 100)), rng.standard_normal(1000).astype(np.float32)) for i in range(20)]
    first = weighted_average(ups)
    assert np.array_equal(first, weighted_average(ups[::-1]))
    assert np.array_equal(first, weighted_average(ups[7:] + ups[:7]))


def test_average_rejects_empty_or_zero_samples():
    with pytest.raises(ValueError):
        weighted_average([])
    with pytest.raises(ValueError):
        weighted_average([(0, 0, np.zeros(2, np.float32))])


def test_layout_roundtrip_and_read_only_input():
    net = build_model("cnn4", 10, (3, 32, 32))
    keys, _ = net.split_keys(1)
    layout = layout_of(net, keys)
    vec = pack(net, layout)
    assert vec.shape == (layout.size,)
    other = build_model("cnn4", 10, (3, 32, 32))
    frozen = vec.copy()
    frozen.flags.writeable = False  # what Ray's object store hands a worker
    BoundLayout.bind(layout, other, torch.device("cpu")).load(frozen)
    for k in keys:
        assert torch.equal(net.state_dict()[k], other.state_dict()[k])
    assert not torch.equal(net.classifier[-1].weight, other.classifier[-1].weight)  # head untouched


def test_server_process_needs_no_torch(tmp_path):
    # The server actor's process must come up fast: torch + Lightning cost ~3 s of imports. It gets the run's
    # plan (config, method, layouts, round-0 vectors) and the spawn function's module; unpickling them must
    # not re-run validation (that imports the models), and it runs the method's server hook.
    from conftest import plan_for, synthetic_tree

    from fedsim.config import validate

    plan = tmp_path / "plan.pkl"
    plan.write_bytes(pickle.dumps(plan_for(validate(synthetic_tree(tmp_path)))))
    code = (f"import pickle, sys; import fedsim.engine.server, fedsim.client.worker; "
            f"plan = pickle.loads(open({str(plan)!r}, 'rb').read()); plan.algorithm.server_update("
            "{'weights': plan.model.initial['shared']}, {'weights': plan.model.initial['shared']}, 1, 8); "
            "assert 'torch' not in sys.modules, 'the server imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_vector_store_keeps_rows_apart_and_read_only():
    from fedsim.core.store import StateMemory, VectorStore

    blocks = []

    class Counting(StateMemory):
        def block(self, rows, size):
            blocks.append(rows)
            return super().block(rows, size)

    store = VectorStore(3, Counting(ram_bytes=1 << 20))
    store.rows_per_block = 2  # force several blocks
    for c in (7, 3, 9):
        store[c] = np.full(3, c, np.float32)
    store[3] = np.arange(3, dtype=np.float32)  # overwrite in place, no new row
    assert len(store) == 3 and blocks == [2, 2]
    assert store[7].tolist() == [7, 7, 7] and store[3].tolist() == [0, 1, 2] and store[9].tolist() == [9, 9, 9]
    default = np.zeros(3, np.float32)
    assert store.get(4, default) is default and 4 not in store
    with pytest.raises(ValueError):
        store[7][0] = 1.0
    assert dict((c, v.tolist()) for c, v in store.items()) == {7: [7, 7, 7], 3: [0, 1, 2], 9: [9, 9, 9]}


def _exact_mean(groups, weights_by_client, vectors, plan):
    """Workers sum their groups; the server adds the partials in the order given."""
    from fedsim.core.aggregate import ReferenceExactSum

    partials = []
    for group in groups:
        summed = ReferenceExactSum(plan)
        for c in group:
            assert summed.fits(vectors[c])
            summed.add(weights_by_client[c], vectors[c])
        partials.append(summed.total)
    total = np.zeros_like(partials[0])
    for p in partials:
        total += p
    weight = sum(weights_by_client[c] for g in groups for c in g)
    return np.concatenate([plan.mean(total, weight, t) for t in range(len(plan.offsets) - 1)])


def test_exact_sums_are_the_same_for_any_grouping_and_order_and_within_their_bound():
    from fedsim.core.aggregate import HEADROOM_BITS, FixedPoint

    rng = np.random.default_rng(1)
    offsets = (0, 3000, 3100, 5000)
    reference = np.concatenate([rng.normal(0, 0.05, 3000), np.zeros(100), rng.normal(0, 3, 1900)]).astype(np.float32)
    vectors = {c: (reference + rng.normal(0, 0.01, 5000)).astype(np.float32) for c in range(40)}
    n = {c: int(rng.integers(1, 600)) for c in range(40)}
    plan = FixedPoint.plan(reference, offsets, sum(n.values()))
    clients = list(range(40))
    one = _exact_mean([clients], n, vectors, plan)
    for workers in (2, 3, 7):
        shuffled = rng.permutation(clients).tolist()
        groups = [shuffled[w::workers] for w in range(workers)][::-1]
        assert np.array_equal(_exact_mean(groups, n, vectors, plan), one)  # bit for bit
    exact = sum(n[c] * vectors[c].astype(np.float64) for c in clients) / sum(n.values())
    # |error| <= 2^(ceil(log2 S) + HEADROOM - 62) of each tensor's reference magnitude 2^e_t (1 for zero tensors).
    bound = np.repeat(np.ldexp(1.0, plan.exponent + int(np.ceil(np.log2(sum(n.values())))) + HEADROOM_BITS - 63),
                      np.diff(offsets))
    assert np.all(np.abs(one - exact) <= bound)
    # The float64 reference's products are float32 (NumPy keeps n/S * float32 in float32): it carries
    # float32 rounding (2e-9 here), fixed point does not (1e-14).
    old = weighted_average([(c, n[c], vectors[c]) for c in clients], as_float32=False)
    assert np.abs(one - exact).max() < np.abs(old - exact).max()


def test_values_beyond_the_headroom_are_out_of_range_not_overflow():
    from fedsim.core.aggregate import HEADROOM_BITS, FixedPoint, ReferenceExactSum

    reference = np.full(4, 0.5, np.float32)  # e = -1: values up to 2^15 fit
    summed = ReferenceExactSum(FixedPoint.plan(reference, (0, 4), total_weight=2 ** 20))
    assert summed.fits(np.full(4, 2.0 ** (HEADROOM_BITS - 1), np.float32))
    assert not summed.fits(np.full(4, 2.0 ** (HEADROOM_BITS - 1) * 1.01, np.float32))
    assert not summed.fits(np.array([0, 0, np.nan, 0], np.float32))
    with pytest.raises(RuntimeError, match="personal weights"):  # the reference refuses any other layout too
        summed.fits(np.zeros(6, np.float32))
    for _ in range(2 ** 4):  # the whole planned weight at the largest value still fits in int64
        summed.add(2 ** 16, np.full(4, 2.0 ** (HEADROOM_BITS - 1), np.float32))
    assert summed.total.max() < 2 ** 63 - 1 and summed.total.max() > 2 ** 60
