"""The server's worker pool (fedsim/engine/pool.py): a silent worker is named, a lost one is replaced in its bundle
with its clients, and one lost more than engine.max_recoveries times in a row stops the run with one line."""
import types

import pytest
from ray.exceptions import GetTimeoutError, RayActorError

from fedsim.engine.pool import WorkerLost, WorkerPool

ENGINE = types.SimpleNamespace(round_timeout_s=5, heartbeat_timeout_s=1, max_recoveries=1)


class Worker:
    """A worker actor's stand-in: ``ping.remote()`` answers, or raises as a dead actor's call does."""

    def __init__(self, name: str, alive: bool = True, cpu: float = 0.0):
        self.name, self.alive, self.cpu = name, alive, cpu
        self.ping = types.SimpleNamespace(remote=self._ping)
        self.cpu_seconds = types.SimpleNamespace(remote=lambda: self.cpu)

    def _ping(self):
        if not self.alive:
            raise RayActorError()
        return f"pong from {self.name}"


@pytest.fixture
def fake_ray():
    """The pool's calls (a backend's put/get/wait/kill), recording what it kills."""
    killed = []
    ray = types.SimpleNamespace(get=lambda refs, timeout=None: refs, kill=killed.append,
                                wait=lambda refs, **_: (list(refs), []),
                                in_this_process=False)  # workers of their own, as Ray's actors are
    return ray, killed


def _pool(workers, spawned, calls):
    assignments = [{0: None, 2: None}, {1: None, 3: None}]
    return WorkerPool(workers, assignments, lambda clients, bundle: spawned.append((sorted(clients), bundle)) or
                      Worker(f"new {len(spawned)}"), ["bundle 0", "bundle 1"], ENGINE, calls)


def test_a_worker_silent_at_startup_is_named(fake_ray):
    ray, _ = fake_ray
    pool = _pool([Worker("a"), Worker("b")], [], ray)
    ray.wait = lambda refs, **_: (list(refs[:1]), list(refs[1:]))
    with pytest.raises(GetTimeoutError, match=r"^worker 1 \(clients 1, 3\) did not answer within "
                                              r"engine.round_timeout_s=5 \(frozen, or out of memory\)$"):
        pool.get_from_each(["call on worker 0", "call on worker 1"])


def test_a_lost_worker_is_replaced_in_its_bundle_until_it_is_lost_too_often(fake_ray):
    ray, killed = fake_ray
    spawned = []
    dead = Worker("b", alive=False)
    pool = _pool([Worker("a"), dead], spawned, ray)
    pool.replace_lost()
    assert spawned == [([1, 3], "bundle 1")] and killed == [dead] and pool.recoveries == 1
    pool.workers[1].alive = False
    with pytest.raises(WorkerLost, match=r"^worker 1 \(clients 1, 3\) died 2 times in a row, more than "
                                         r"engine.max_recoveries=1; "):
        pool.replace_lost()
    pool.round_completed()  # a completed round starts the count again
    pool.workers[1].alive = False
    pool.replace_lost()
    assert pool.recoveries == 3 and pool.losses_in_a_row == 1


def test_a_rounds_cpu_time_is_each_workers_since_the_last_round_and_a_replacement_counts_from_zero(fake_ray):
    a, b = Worker("a", cpu=2.0), Worker("b", cpu=3.0)
    pool = _pool([a, b], [], fake_ray[0])
    assert pool.cpu_seconds_since_last() == 5.0
    a.cpu, b.cpu = 2.5, 4.0
    assert pool.cpu_seconds_since_last() == 1.5
    b.alive = False
    pool.replace_lost()
    a.cpu, pool.workers[1].cpu = 3.0, 0.25  # the replacement's own total, from its start
    assert pool.cpu_seconds_since_last() == 0.75
