"""A worker's runtime: its exact device sums, its layouts bound to the model, what it keeps of a client whose
round does not count, and how it scores many clients."""
import numpy as np
import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_a_client_outside_the_fixed_point_range_keeps_nothing_and_is_reported(tmp_path, data_root):
    from conftest import client_runtime

    from fedsim.algorithms import WEIGHTS
    from fedsim.core.aggregate import FixedPoint
    from fedsim.core.protocol import FixedPointScales

    rt = client_runtime(data_root, "fedper")
    weights = rt.layouts["shared"].pack()
    fits = FixedPointScales({WEIGHTS: FixedPoint.plan(weights, rt.layouts["shared"].offsets, 1000)}, {WEIGHTS: False})
    tiny = FixedPointScales({WEIGHTS: FixedPoint.plan(weights * 1e-9, rt.layouts["shared"].offsets, 1000)}, {WEIGHTS: False})
    out = rt.train_and_sum({WEIGHTS: weights}, [0, 1], 1, tiny)
    assert [(r.diverged, r.out_of_range) for r in out.reports] == [(True, True)] * 2 and not out.sums[WEIGHTS].any()
    assert out.weights[WEIGHTS] == 0 and len(rt.slots["personal"]) == 0  # no personal state kept either
    kept = rt.train_and_sum({WEIGHTS: weights}, [0, 1], 1, fits)
    assert not any(r.diverged for r in kept.reports) and len(rt.slots["personal"]) == 2
    assert kept.weights[WEIGHTS] == sum(r.n_train for r in kept.reports)


def test_scoring_many_clients_loads_the_global_weights_once_and_stays_exact(data_root):
    from conftest import client_runtime

    from fedsim.algorithms import WEIGHTS

    for algorithm in ("fedper", "apfl"):  # APFL changes the loaded model in place to score its mixture
        rt = client_runtime(data_root, algorithm, eval__finetune_epochs=0)
        state = {WEIGHTS: rt.layouts["shared"].pack()}
        for client in (0, 1, 2):
            rt.keep(client, rt.train_client(state, client, 1))
        loads = []

        class Counting:  # the shared layout, counting how often it is copied into the model
            def __getattr__(self, name, layout=rt.layouts["shared"]):
                return getattr(layout, name)

            def load(self, vector, layout=rt.layouts["shared"]):
                loads.append(1)
                layout.load(vector)

        rt.layouts["shared"] = Counting()
        together = rt.evaluate(state, [0, 1, 2], 1)
        one_by_one = [rt.evaluate(state, [c], 1)[0] for c in (0, 1, 2)]
        assert together == one_by_one
        if algorithm == "fedper":
            assert len(loads) == 1  # the global part once, then only personal parts swapped


@pytest.mark.parametrize("device", DEVICES)
def test_the_device_exact_sum_equals_the_numpy_reference_bit_for_bit(device):
    from fedsim.client.resident import ExactSum
    from fedsim.core.aggregate import FixedPoint, ReferenceExactSum

    rng = np.random.default_rng(2)
    offsets = (0, 300, 310, 1000)
    reference = np.concatenate([rng.normal(0, 0.05, 300), np.zeros(10), rng.normal(0, 3, 690)]).astype(np.float32)
    vectors = [(reference + rng.normal(0, 0.01, 1000)).astype(np.float32) for _ in range(12)]
    vectors[3][5] = np.nan
    vectors[7][400] = 2.0 ** 22  # beyond the headroom of its tensor (max < 16, so the limit is <= 2^20)
    weights = [int(w) for w in rng.integers(1, 600, len(vectors))]
    plan = FixedPoint.plan(reference, offsets, sum(weights))
    expected, on_device = ReferenceExactSum(plan), ExactSum(plan, torch.device(device))
    rejected = []
    for client, (weight, vector) in enumerate(zip(weights, vectors)):
        fits = bool(on_device.stage(torch.from_numpy(vector).to(device), weight))
        assert fits == expected.fits(vector)
        if not fits:
            rejected.append(client)
        else:
            expected.add(weight, vector)
            on_device.add()
    assert rejected == [3, 7] and np.array_equal(on_device.total.cpu().numpy(), expected.total)
    with pytest.raises(RuntimeError, match="personal weights"):
        on_device.stage(torch.zeros(1001, device=device), 1)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bound_layout_loads_and_packs_like_the_numpy_layout(device):
    """One fused copy per load or pack, into a channels_last model with integer buffers, equals the key-by-key
    numpy path; the version counters see the load."""
    from fedsim.client.resident import BoundLayout
    from fedsim.models import build_model
    from fedsim.models.state import layout_of, load_arrays, pack

    torch.manual_seed(0)
    net = build_model("cnn4", 10, (3, 32, 32)).to(memory_format=torch.channels_last)
    layout = layout_of(net, list(net.state_dict()))
    assert any(t.dtype == torch.int64 for t in net.state_dict().values())  # BatchNorm's num_batches_tracked
    vector = np.random.default_rng(0).normal(size=layout.size).astype(np.float32)
    vector[layout.offsets[-2]:] = np.round(vector[layout.offsets[-2]:])  # integral, as a packed integer buffer is
    expected = pack(net, layout)
    net.to(device)
    bound = BoundLayout.bind(layout, net, torch.device(device))
    assert len(bound.groups) == 2  # float32 and int64 targets copied apart: each group can be fused
    assert np.array_equal(bound.pack(), expected)
    before = bound.version()
    bound.load(vector)
    assert bound.version() > before
    packed = bound.pack_tensor()
    assert packed.device.type == device and np.array_equal(packed.cpu().numpy(), bound.pack())
    reference = build_model("cnn4", 10, (3, 32, 32)).to(memory_format=torch.channels_last)
    load_arrays(reference, layout.arrays(vector), "test")
    assert np.array_equal(pack(reference, layout), bound.pack())


def test_validation_is_scored_on_the_held_out_samples_with_tests_protocol_and_never_trained_on(data_root):
    """data.validation: each record scores the client's validation split beside its test data, initial and after
    fine-tuning, and fine-tuning (like training) sees only the samples left to train on."""
    from conftest import client_runtime

    from fedsim.algorithms import WEIGHTS

    rt = client_runtime(data_root, "fedavg", data__validation=0.25)
    plain = client_runtime(data_root, "fedavg")
    cd, whole = rt.client_data[0], plain.client_data[0]
    assert np.array_equal(np.union1d(cd.train, cd.val), whole.train) and not np.intersect1d(cd.train, cd.val).size
    x, y = rt.client_tensors(0, "val")
    assert torch.equal(y, torch.as_tensor(rt.data.train_y[cd.val])) and len(rt.client_tensors(0, "train")[1]) == len(cd.train)
    state = {WEIGHTS: rt.layouts["shared"].pack()}
    [rec] = rt.evaluate(state, [0], 1)
    assert rec["n_train"] == len(cd.train) and rec["n_validation"] == len(cd.val) > 0
    assert {"validation_acc", "validation_loss", "validation_acc_personalized", "validation_loss_personalized"} <= rec.keys()
    rt.load_global(state[WEIGHTS])
    assert (rec["validation_loss"], rec["validation_acc"]) == rt.score(x, y)  # the initial model, as test's acc scores it
    [before] = plain.evaluate(state, [0], 1)
    assert "validation_acc" not in before and before["n_train"] == len(whole.train)
