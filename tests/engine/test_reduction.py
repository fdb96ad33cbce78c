"""fedsim/engine/reduction.py: the reduction chosen once per run, and the synchronous sums' update: the totals and the new
state held, one tensor's float64 mean at a time, and a server hook that does not say it works tensor by tensor given
whole vectors."""
import tracemalloc
import types

import numpy as np
import pytest
from conftest import in_process_server, six_client_run

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.base import Algorithm
from fedsim.core.aggregate import FixedPoint, ReferenceExactSum, RoundSums
from fedsim.core.protocol import FixedPointScales
from fedsim.engine.reduction import BufferedSums, ReplyReduction, SumReduction
from fedsim.privacy.mechanism import ServerPrivacy


@pytest.mark.parametrize("server, system, chosen", [({}, None, SumReduction),
                                                    ({"aggregator": "median"}, None, ReplyReduction),
                                                    ({}, {"devices": {"preset": "uniform"}, "mode": "async",
                                                          "async_buffer": 2, "concurrency": 3}, BufferedSums)])
def test_the_reduction_is_chosen_once_from_the_plan(tmp_path, data_root, monkeypatch, server, system, chosen):
    cfg = six_client_run(tmp_path, data_root, "fedavg", 1, system=system)
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update=server)})
    assert type(in_process_server(cfg).reduction) is chosen


def _reduction(algorithm, weights, offsets, num_clients, scaling, sums) -> SumReduction:
    """A synchronous round's reduction over a server holding ``weights``, its sums taken in."""
    reduction = SumReduction.__new__(SumReduction)
    reduction.plan = types.SimpleNamespace(num_clients=num_clients)
    reduction.algorithm, reduction.tensor_offsets, reduction.shared_size = algorithm, offsets, offsets[-1]
    reduction.state = types.SimpleNamespace(values={WEIGHTS: weights}, privacy=ServerPrivacy(None))
    reduction.scaling, reduction.sums = scaling, sums
    return reduction


def test_aggregation_holds_the_totals_and_the_new_state_but_no_float64_model():
    """Old: W partials, then the int64 total, the float64 mean and the float32 result: 5 model sizes of heap beyond
    the partials. Now: the total (2) and the new state (1), plus one tensor's float64 mean at a time."""
    rng = np.random.default_rng(0)
    offsets = tuple(range(0, 40 * 25_000 + 1, 25_000))  # 40 tensors of 25,000 values: 4 MB of float32
    size = offsets[-1]
    weights = rng.standard_normal(size).astype(np.float32)
    scaling = FixedPointScales({WEIGHTS: FixedPoint.plan(weights, offsets, 300)}, {WEIGHTS: False})
    partials = [rng.integers(-2 ** 40, 2 ** 40, size) for _ in range(3)]
    tracemalloc.start()
    sums = RoundSums(scaling.scales, size)
    for partial in partials:
        sums.add({WEIGHTS: partial}, {WEIGHTS: 100})
    server = _reduction(Algorithm(), weights, offsets, 10, scaling, sums)
    server.update(1, [None] * 4, None)  # synchronous: the reports are only counted
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3.5 * 4 * size
    # Bit for bit the whole-vector arithmetic the server did before: float64 total x 2^L_t / S, then float32.
    mean = sum(partials).astype(np.float64)
    mean *= np.repeat(np.ldexp(1.0, scaling.scales[WEIGHTS].quantum_exponent), np.diff(offsets))
    mean /= 300
    assert np.array_equal(server.state.values[WEIGHTS], mean.astype(np.float32))


def test_a_hook_that_does_not_say_it_works_tensor_by_tensor_gets_whole_vectors():
    """A user's server hook may need a whole-model quantity (a global norm): unless its class declares
    server_update_by_tensor, it is called once on whole vectors, as before; the built-in hooks tensor by tensor."""
    offsets = (0, 3, 10)
    weights = np.arange(10, dtype=np.float32)
    scaling = FixedPointScales({WEIGHTS: FixedPoint.plan(weights, offsets, 1)}, {WEIGHTS: True})
    seen = {}

    class GlobalNorm(Algorithm):
        def server_update(self, state, means, sampled, num_clients):
            seen.setdefault(type(self).__name__, []).append(means[WEIGHTS].size)
            state[WEIGHTS] = (means[WEIGHTS] / np.linalg.norm(means[WEIGHTS])).astype(np.float32)

    class Elementwise(GlobalNorm):
        server_update_by_tensor = True

    for algorithm in (GlobalNorm(), Elementwise()):
        exact = ReferenceExactSum(scaling.scales[WEIGHTS])
        exact.add(1, weights)
        sums = RoundSums(scaling.scales, 10)
        sums.add({WEIGHTS: exact.total}, {WEIGHTS: 1})
        server = _reduction(algorithm, weights, offsets, 2, scaling, sums)
        server.update(1, [None] * 2, None)
        if isinstance(algorithm, Elementwise):
            assert seen["Elementwise"] == [3, 7]
        else:
            assert seen["GlobalNorm"] == [10]
            assert np.linalg.norm(server.state.values[WEIGHTS]) == pytest.approx(1.0, rel=1e-6)
