"""The server's memory for big models: it folds each worker's partial into the round's totals as it arrives and
keeps none of them, hands the means to the server hook tensor by tensor, and drops the pages of Ray's object store
it has read or written; none of which changes a result."""
import gc
import mmap
import tracemalloc
import types
import weakref

import numpy as np
import pytest
from conftest import in_process_server, round_records, six_client_run

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.base import Algorithm
from fedsim.core.aggregate import FixedPoint, ReferenceExactSum, RoundSums
from fedsim.core.pages import release_shared
from fedsim.core.protocol import FixedPointScales
from fedsim.engine.reduction import SumReduction
from fedsim.privacy.mechanism import ServerPrivacy


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


def _lazy_answers(monkeypatch, server) -> list[int]:
    """Workers' training answers made only when the server asks for them (as Ray hands them over), arriving in
    the reverse order of the calls. Returns, per answer added to the round's totals, how many answers added
    before it are still alive."""
    import fedsim.engine.pool as pool_module

    handed: list[weakref.ref] = []
    alive_at_add: list[int] = []
    for worker in server.pool.workers:
        train = worker.runtime.train_and_sum
        worker.train_and_sum = types.SimpleNamespace(remote=lambda *args, train=train: lambda: train(*args))
    add = RoundSums.add

    def counting_add(sums, partial_sums, weights):
        gc.collect()
        alive_at_add.append(sum(ref() is not None for ref in handed))
        handed.append(weakref.ref(partial_sums[WEIGHTS]))
        add(sums, partial_sums, weights)

    def get(ref, timeout=None):
        return ref() if callable(ref) else ref

    monkeypatch.setattr(RoundSums, "add", counting_add)
    monkeypatch.setattr(pool_module.ray, "get", get)
    monkeypatch.setattr(pool_module.ray, "wait", lambda refs, **_: (list(refs)[::-1], []))
    return alive_at_add


def test_partials_are_folded_as_they_arrive_dropped_and_give_the_same_state(tmp_path, data_root, monkeypatch):
    def run(workers, lazy):
        server = in_process_server(monkeypatch, six_client_run(tmp_path, data_root, "scaffold", workers, 2))
        server.restore(None)
        alive = _lazy_answers(monkeypatch, server) if lazy else []
        return round_records([server.round(r) for r in (1, 2)]), server.state, alive

    one, state1, _ = run(1, lazy=False)
    three, state3, alive = run(3, lazy=True)
    assert three == one and all(np.array_equal(state1[k], state3[k]) for k in state1)
    assert len(alive) > 2 and not any(alive)  # one answer per worker with sampled clients: none held at the next


def _shared_resident_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssShmem:"))


def test_released_pages_of_shared_memory_leave_the_process_but_keep_their_data():
    try:
        _shared_resident_kb()
    except (OSError, StopIteration):
        pytest.skip("needs Linux's /proc/self/status")
    shared = mmap.mmap(-1, 32 << 20)  # MAP_SHARED, like Ray's object store
    array = np.ndarray(8 << 20, np.float32, buffer=shared)
    array[:] = np.arange(array.size)
    before = _shared_resident_kb()
    release_shared(array)
    assert before - _shared_resident_kb() >= 31 << 10
    assert np.array_equal(array, np.arange(array.size, dtype=np.float32))
    private = np.arange(1 << 20, dtype=np.float64)
    release_shared(private)  # private memory: MADV_DONTNEED would zero it; it is left alone
    assert np.array_equal(private, np.arange(1 << 20, dtype=np.float64))


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
