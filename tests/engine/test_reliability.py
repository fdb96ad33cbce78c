"""Kill-and-resume, worker loss, non-finite losses: results must equal a fault-free run exactly."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import each_round, in_process_server, own_ray_pids

from fedsim.config import validate
from fedsim.simulate import run
from fedsim.engine.runfolder_checks import load_run_config
from fedsim.errors import CheckpointError, TrainingDiverged


def tiny(tmp_path, data_root, name, **over):
    tree = {
        "name": name, "seed": 5, "algorithm": "fedper", "out_dir": str(tmp_path),
        "data": {"root": str(data_root), "num_clients": 4, "k": 3, "train_fraction": 0.02, "test_fraction": 0.05},
        "train": {"rounds": 4, "local_epochs": 1, "batch_size": 50},
        "eval": {"finetune_epochs": 0},
        "engine": {"workers": 2, "round_timeout_s": 300, "checkpoint_every": 1},
    }
    for dotted, value in over.items():
        *parents, leaf = dotted.split("__")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return validate(tree)


HUGE = {"lr": 1e30, "momentum": 0.9, "weight_decay": 0}  # overflows to inf/NaN within a few steps


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_worker_killed_mid_round_is_replaced_and_results_match(tmp_path, data_root, local_ray):
    clean = run(tiny(tmp_path, data_root, "clean", train__local_epochs=3))
    killed = {}

    def kill_a_worker_during_round_3(result):
        if result.round == 2 and not killed:
            def kill_soon():
                time.sleep(1.0)  # inside round 3's local training
                victim = own_ray_pids(b"ray::Worker")[0]
                os.kill(victim, signal.SIGKILL)
                killed["pid"] = victim

            threading.Thread(target=kill_soon, daemon=True).start()

    faulty = run(tiny(tmp_path, data_root, "faulty", train__local_epochs=3), callbacks=[each_round(kill_a_worker_during_round_3)])
    assert killed, "the fault was never injected"
    assert killed["pid"] not in {w["pid"] for w in faulty.summary["workers"]}  # it was replaced
    assert metrics(faulty.run_dir) == metrics(clean.run_dir)


def _start_cli(cfg_path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", "run", str(cfg_path), "--quiet", *extra],
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_sigkill_mid_round_then_resume_is_bit_identical(tmp_path, local_ray):
    """The CLI is killed with its Ray head and workers (nothing gets to clean up); a later process resumes the
    folder to the same per-client results as a run never interrupted (here, in this test's own Ray)."""
    from conftest import synthetic_tree

    rounds = 12  # synthetic clients: a round takes a fraction of a second, Ray's start-up is most of a run
    tree = synthetic_tree(tmp_path, "crashy", train__rounds=rounds, engine__checkpoint_every=1)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(tree))
    proc = _start_cli(cfg_path)
    rows = tmp_path / "crashy" / "rounds.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not rows.exists() or len(rows.read_text().splitlines()) < 2):
        time.sleep(0.05)
    time.sleep(0.1)  # into round 3
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert 2 <= len(rows.read_text().splitlines()) < rounds, proc.stdout.read().decode()[-2000:]

    straight = run(validate({**tree, "name": "straight"})).run_dir
    run(load_run_config(tmp_path / "crashy"), resume=True)
    assert metrics(tmp_path / "crashy") == metrics(straight)
    crashy = json.loads((tmp_path / "crashy" / "summary.json").read_text())
    assert crashy["per_client_acc"] == json.loads((straight / "summary.json").read_text())["per_client_acc"]


def test_nonfinite_loss_stops_with_client_and_round_named(tmp_path, data_root, local_ray):
    cfg = tiny(tmp_path, data_root, "nan", train__body=HUGE, train__head=HUGE)
    with pytest.raises(TrainingDiverged, match=r"client \d+, round \d+: training loss is not finite"):
        run(cfg)


def test_nonfinite_loss_can_drop_the_update(tmp_path, data_root, local_ray):
    cfg = tiny(tmp_path, data_root, "nan-drop", train__rounds=2, train__on_nonfinite="drop",
               train__body=HUGE, train__head=HUGE)
    res = run(cfg)
    rows = [json.loads(line) for line in (res.run_dir / "rounds.jsonl").read_text().splitlines()]
    assert any(r["dropped"] for r in rows)


def test_resume_refuses_a_foreign_checkpoint(tmp_path, data_root, local_ray, monkeypatch):
    first = run(tiny(tmp_path, data_root, "a", train__rounds=1))
    # Swap in another run's checkpoint: same model, different algorithm -> different shared layout. (That run's
    # round goes through the engine's Server with in-process workers: the checkpoint is what Ray's would write.)
    other = in_process_server(tiny(tmp_path, data_root, "b", train__rounds=1, algorithm="fedavg"))
    other.restore(None)
    other.round(1)
    other.checkpoint(str(tmp_path / "b"), 1)
    monkeypatch.undo()  # the engine's own Ray again
    import shutil

    shutil.rmtree(first.run_dir / "checkpoints")
    shutil.copytree(tmp_path / "b" / "checkpoints", first.run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match="different configuration"):
        run(load_run_config(first.run_dir), resume=True)
    # A damaged checkpoint is skipped (resume falls back to an older one, here to round 0), never loaded.
    from fedsim.core.checkpoint import latest

    (first.run_dir / "checkpoints" / "round-0001" / "global.npy").write_bytes(b"\x93NUMPY trunc")
    assert latest(first.run_dir) is None
