"""A real two-node Ray cluster on this machine: `ray start --head` + `ray start --address`, the
quickstart submitted with `ray job submit --working-dir`, compared with a local run."""
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cluster_yaml_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    validate_config(prepare_config(config))
    types = config["available_node_types"]
    assert config["head_node_type"] in types and any("gpu" in name for name in types)
    assert any("pip install" in cmd and "fedsim" in cmd for cmd in config["setup_commands"])
    import ray

    assert any(f"ray[default]=={ray.__version__}" in cmd for cmd in config["setup_commands"])  # the tested Ray
    assert {".venv", "runs", "wandb"} <= set(config["rsync_exclude"])
    sync = [cmd for cmd in config["setup_commands"] if "s3 sync" in cmd]
    assert sync and not any("|| true" in cmd for cmd in sync)  # a failed data sync fails the setup
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in cmd for cmd in starts if "ray start" in cmd)
    assert "~/.ray/auth_token" in config["cluster_synced_files"]
    assert "RAY_AUTH_MODE=disabled" not in (REPO / "ray_cluster.yaml").read_text()
    broken = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    broken["available_node_types"]["head"]["min_wrokers"] = 1
    with pytest.raises(Exception, match="min_wrokers"):
        validate_config(prepare_config(broken))


def cluster_env(data_root: Path) -> dict:
    """Environment of the test's nodes and clients: token authentication with a token of the test's own
    (every node, `ray job submit` and the job itself use it; ~/.ray is left alone), multi-node mode."""
    env = dict(os.environ, FEDSIM_DATA=str(data_root), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1")
    env.pop("RAY_ADDRESS", None)
    return env


def _node(*args: str, env: dict) -> subprocess.Popen:
    # --block keeps each node's processes under one parent we can stop without touching other Ray instances.
    # Each node's agents get their own free ports: two nodes (and any other Ray) share this machine.
    ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                      "metrics-export-port", "runtime-env-agent-port")]
    return subprocess.Popen([RAY, "start", "--block", *ports, *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_for_nodes(address: str, count: int, env: dict) -> None:
    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='error'); "
             "print(sum(n['Alive'] for n in ray.nodes()))")
    deadline = time.time() + 90
    while time.time() < deadline:
        out = subprocess.run([sys.executable, "-c", probe, address], env=env, capture_output=True, text=True, timeout=60)
        if out.returncode == 0 and out.stdout.strip().endswith(str(count)):
            return
        time.sleep(2)
    raise AssertionError(f"cluster at {address} never reached {count} nodes")


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_job_submitted_to_two_node_cluster_matches_local_run(tmp_path, data_root):
    overrides = ["sweep.algorithm=[fedper]", "train.rounds=2", "train.local_epochs=1", "data.train_fraction=0.02",
                 "data.test_fraction=0.05", "engine.round_timeout_s=300"]
    env = cluster_env(data_root)
    local = subprocess.run([sys.executable, "-m", "fedsim.cli.main", "run", "experiments/quickstart.yaml", "--quiet",
                            *overrides, f"out_dir={tmp_path / 'local'}"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]

    gcs, dashboard = free_port(), free_port()
    head = _node("--head", f"--port={gcs}", "--num-cpus=1", "--include-dashboard=true",
                 "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", env=env)
    second = None
    try:
        _wait_for_nodes(f"127.0.0.1:{gcs}", 1, env)
        second = _node(f"--address=127.0.0.1:{gcs}", "--num-cpus=1", env=env)
        _wait_for_nodes(f"127.0.0.1:{gcs}", 2, env)
        runtime_env = {"env_vars": {k: env[k] for k in ("FEDSIM_DATA", "FEDSIM_CACHE") if k in env}}
        submit = [RAY, "job", "submit", f"--address=http://127.0.0.1:{dashboard}", f"--working-dir={REPO}",
                  f"--runtime-env-json={json.dumps(runtime_env)}", "--",
                  sys.executable, "-m", "fedsim.cli.main", "run", "experiments/quickstart.yaml", "--quiet", *overrides,
                  f"out_dir={tmp_path / 'cluster'}"]
        for _ in range(30):  # the head's job agent comes up some seconds after the node
            job = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=600)
            if "No available agent" not in job.stdout + job.stderr:
                break
            time.sleep(3)
        assert job.returncode == 0 and "succeeded" in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
    finally:
        for proc in (second, head):
            if proc is not None:
                _stop(proc)
        # `ray start` records the head for later `ray.init()` calls; do not leave a pointer to a dead cluster.
        pointer = Path("/tmp/ray/ray_current_cluster")
        if pointer.exists() and pointer.read_text().strip().endswith(f":{gcs}"):
            pointer.unlink()
    cluster_run, local_run = tmp_path / "cluster" / "quickstart-fedper", tmp_path / "local" / "quickstart-fedper"
    workers = json.loads((cluster_run / "summary.json").read_text())["workers"]
    assert len({w["node"] for w in workers}) == 2  # one worker on each node
    assert _metrics(cluster_run) == _metrics(local_run)
