"""The server's memory for big models: it folds each worker's partial into the round's totals as it arrives and
keeps none of them and drops the pages of Ray's object store it has read or written; none of which changes a result.
(The means handed to the server hook tensor by tensor: tests/engine/test_reduction.py.)"""
import gc
import mmap
import types
import weakref

import numpy as np
import pytest
from conftest import in_process_server, round_records, six_client_run

from fedsim.algorithms import WEIGHTS
from fedsim.core.aggregate import RoundSums
from fedsim.core.pages import release_shared


def _lazy_answers(monkeypatch, server) -> list[int]:
    """Workers' training answers made only when the server asks for them (as Ray hands them over), arriving in
    the reverse order of the calls. Returns, per answer added to the round's totals, how many answers added
    before it are still alive."""
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
    monkeypatch.setattr(server.pool.calls, "get", get)
    monkeypatch.setattr(server.pool.calls, "wait", lambda refs, **_: (list(refs)[::-1], []))
    return alive_at_add


def test_partials_are_folded_as_they_arrive_dropped_and_give_the_same_state(tmp_path, data_root, monkeypatch):
    def run(workers, lazy):
        server = in_process_server(six_client_run(tmp_path, data_root, "scaffold", workers, 2))
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
