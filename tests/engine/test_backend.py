"""engine.backend (fedsim/engine/backend.py): the local backend runs the same server and worker in the driver's
process, bit for bit what Ray's actors give on one and three workers, and a user's breakpoint() stops there."""
import json
import os
import sys
import time

import pytest
from conftest import lightning_tree, per_client, synthetic_tree

from fedsim.config import validate
from fedsim.errors import ConfigError
from fedsim.simulate import run


def _scaffold(tmp_path, backend: str, workers: int):
    tree = synthetic_tree(tmp_path, f"{backend}-{workers}", algorithm="scaffold", engine__backend=backend,
                          engine__workers=workers, engine__cpus_per_worker=0.5, train__rounds=2, train__eval_every=1)
    return run(validate(tree))


def test_the_local_backend_equals_ray_on_one_and_three_workers_bit_for_bit(tmp_path, local_ray):
    # SCAFFOLD: client and server control variates, kept by the worker between rounds and checkpointed.
    local = _scaffold(tmp_path, "local", 1)
    records = per_client(local.run_dir)
    assert len(records) == 8 * 2
    ray_one, ray_three = (per_client(_scaffold(tmp_path, "ray", workers).run_dir) for workers in (1, 3))
    assert records == ray_one == ray_three
    (worker,) = local.summary["workers"]
    assert worker["pid"] == os.getpid()  # in this process, not an actor of the Ray this test shares


def test_a_breakpoint_in_training_step_stops_in_the_drivers_process(tmp_path, monkeypatch, no_ray):
    stops = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *args, **kwargs: stops.append(os.getpid()))
    tree = lightning_tree(tmp_path, "StopsInADebugger", engine__workers=1, engine__backend="local", train__rounds=1)
    run(validate(tree))
    # The driver's one rehearsal step, then every training step of the round's two clients (2 epochs of 1 batch).
    assert len(stops) > 1 and set(stops) == {os.getpid()}
    assert not sys.modules["ray"].is_initialized()  # the local backend started no Ray


def test_the_local_backend_runs_one_worker():
    with pytest.raises(ConfigError, match=r"engine.backend: local runs one worker in this process \(engine.workers "
                                          r"is 2\); set engine.workers: 1"):
        validate(synthetic_tree("/tmp", engine__backend="local"))


def test_a_local_runs_cpu_seconds_count_the_workers_once(tmp_path, no_ray):
    # The worker's calls run in this process, so its CPU time is already in the server's own process time; counted
    # again from the worker, the rounds summed to about twice what the process spent.
    tree = synthetic_tree(tmp_path, "cpu", engine__backend="local", engine__workers=1, train__rounds=2,
                          train__local_epochs=30)
    before = time.process_time()
    result = run(validate(tree))
    spent = time.process_time() - before
    rounds = [json.loads(line) for line in (result.run_dir / "rounds.jsonl").read_text().splitlines()]
    counted = sum(r["cpu_seconds"] for r in rounds)
    assert 0 < counted <= spent and all(r["cpu_counted_once"] for r in rounds)
