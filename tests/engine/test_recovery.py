"""Run-time failures on a live Ray: a frozen worker is replaced, a worker lost too often stops the run with
a line naming it, a dead server ends in RunFailed with the resume command, and the resumed or recovered
runs equal an undisturbed one."""
import json
import os
import signal
import threading
import time

import pytest
from conftest import each_round, own_ray_pids, per_client, read_jsonl, synthetic_tree

from fedsim.cli import main as cli
from fedsim.config import validate
from fedsim.simulate import run
from fedsim.engine.runfolder_checks import load_run_config
from fedsim.errors import RunFailed


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, local_ray):
    return run(validate(synthetic_tree(tmp_path_factory.mktemp("clean"), "clean")))


def after_round(target: int, action):
    """A callback that runs ``action`` once, in the background, shortly after round ``target``."""
    fired = {}

    def on_round(result):
        if result.round == target and not fired:
            fired["at"] = time.time()
            threading.Thread(target=lambda: fired.setdefault("pid", action()), daemon=True).start()

    return each_round(on_round), fired


def signal_first(title: bytes, sig: int):
    def act():
        victim = own_ray_pids(title)[0]
        os.kill(victim, sig)
        return victim
    return act


@pytest.mark.slow
def test_frozen_worker_is_replaced_and_results_match(tmp_path, undisturbed):
    cfg = validate(synthetic_tree(tmp_path, "frozen", engine__heartbeat_timeout_s=2))
    on_round, fired = after_round(1, signal_first(b"ray::Worker", signal.SIGSTOP))
    result = run(cfg, callbacks=[on_round])
    assert fired.get("pid"), "the fault was never injected"
    assert fired["pid"] not in {w["pid"] for w in result.summary["workers"]}
    assert per_client(result.run_dir) == per_client(undisturbed.run_dir)


def test_worker_lost_too_often_stops_with_its_name(tmp_path, local_ray):
    cfg = validate(synthetic_tree(tmp_path, "lost", engine__max_recoveries=0))
    on_round, fired = after_round(1, signal_first(b"ray::Worker", signal.SIGKILL))
    with pytest.raises(RunFailed, match=r"worker \d \(clients [\d, ]+\) died 1 times in a row") as info:
        run(cfg, callbacks=[on_round])
    assert "\n" not in str(info.value) and f"fedsim run --resume {tmp_path / 'lost'}" in str(info.value)


@pytest.mark.slow
def test_dead_server_fails_with_the_resume_command_and_resume_matches(tmp_path, undisturbed):
    cfg = validate(synthetic_tree(tmp_path, "srv"))
    on_round, fired = after_round(2, signal_first(b"ray::Server", signal.SIGKILL))
    with pytest.raises(RunFailed, match="the server actor died") as info:
        run(cfg, callbacks=[on_round])
    assert info.value.resume_command == f"fedsim run --resume {tmp_path / 'srv'}"
    run(load_run_config(tmp_path / "srv"), resume=True)
    assert per_client(tmp_path / "srv") == per_client(undisturbed.run_dir)


def test_resume_that_extends_rounds_is_remembered(tmp_path, local_ray):
    run(validate(synthetic_tree(tmp_path, "ext", train__rounds=1)))
    run(load_run_config(tmp_path / "ext", ["train.rounds=2"]), resume=True)
    assert load_run_config(tmp_path / "ext").train.rounds == 2  # a plain resume keeps the extended count
    assert [r["round"] for r in read_jsonl(tmp_path / "ext" / "rounds.jsonl")] == [1, 2]
    summary = json.loads((tmp_path / "ext" / "summary.json").read_text())
    assert [(p["from_round"], p["to_round"]) for p in summary["parts"]] == [(1, 1), (2, 2)]  # both invocations
    assert summary["wall_seconds"] == sum(p["seconds"] for p in summary["parts"])


def test_cli_exit_code_3_is_one_line_with_the_resume_command(tmp_path, capsys, monkeypatch):
    def broken_run(cfg, **_):
        raise RunFailed("No space left on device (/runs/x/metrics.jsonl)", tmp_path / "runs" / "x")

    monkeypatch.setattr("fedsim.simulate.run", broken_run)
    (tmp_path / "c.yaml").write_text(f"out_dir: {tmp_path / 'runs'}\nname: x\n"
                                     "data: {dataset: synthetic, partition: natural, num_clients: 4}\nmodel: {name: mlp}\n")
    assert cli.main(["run", str(tmp_path / "c.yaml")]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (f"fedsim: error: run failed: No space left on device (/runs/x/metrics.jsonl); continue it with "
                   f"`fedsim run --resume {tmp_path / 'runs' / 'x'}`")


def test_a_worker_silent_at_startup_is_named_by_the_servers_restore(tmp_path, monkeypatch):
    """Before the workers answer pings (still importing torch), only the round timeout applies; when it passes, the
    server's restore names the worker that never answered instead of a bare timeout (the pool's own test:
    tests/engine/test_pool.py)."""
    import fedsim.engine.pool as pool_module
    from conftest import in_process_server

    cfg = validate(synthetic_tree(tmp_path, "silent", engine__backend="ray", engine__round_timeout_s=1))
    server = in_process_server(cfg)
    for index, worker in enumerate(server.pool.workers):  # distinct stand-ins for the calls' ObjectRefs
        worker.runtime.load_state = lambda ckpt, index=index: f"call on worker {index}"
    monkeypatch.setattr(server.pool.calls, "wait", lambda refs, **_: (list(refs[:1]), list(refs[1:])))
    with pytest.raises(pool_module.GetTimeoutError, match=r"^worker 1 \(clients [\d, ]+\) did not answer within "
                                                          r"engine.round_timeout_s=1"):
        server.restore(None)


def test_run_time_failures_are_described_in_one_line():
    """What Ray raises in the entrypoint, reduced to the line `fedsim: error: run failed: ...` shows."""
    import errno

    from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

    from fedsim.engine.failures import describe_failure

    def from_server(cause):
        return RayTaskError("Server.round", "Traceback (most recent call last):\n  ...", cause).as_instanceof_cause()

    start_failed = RayActorError(error_msg="The actor died because of an error raised in its creation task\n"
                                           "Traceback (most recent call last):\nMemoryError: cannot allocate")
    cases = {
        from_server(start_failed): "a worker failed to start or died (MemoryError: cannot allocate)",
        from_server(OSError(errno.ENOSPC, "No space left on device", "/r/x.npz")): "No space left on device (/r/x.npz)",
        from_server(GetTimeoutError("worker 1 (clients 1, 2) did not answer")): "worker 1 (clients 1, 2) did not answer",
        ActorDiedError(): "the server actor died (its process was killed or ran out of memory)",
    }
    for err, line in cases.items():
        assert describe_failure(err) == line


def test_a_worker_dying_while_the_run_starts_is_replaced(tmp_path, monkeypatch):
    from conftest import InProcessWorker, in_process_server
    from ray.exceptions import RayActorError

    from fedsim.client.runtime import ClientRuntime

    cfg = validate(synthetic_tree(tmp_path, "startup"))
    server = in_process_server(cfg)

    def died(*_):
        raise RayActorError()

    server.pool.workers[0].runtime.load_state = died
    server.pool.workers[0].ping.remote = died
    replacement = InProcessWorker(ClientRuntime(server.plan, server.plan.assignments[0]))
    server.pool.spawn = lambda clients, bundle: replacement
    assert server.restore(None) == 0
    assert server.pool.workers[0] is replacement and server.pool.recoveries == 1
