"""A real two-node Ray cluster on this machine whose nodes share no disk: `ray start --head` +
`ray start --address` (in its own mount namespace, where the head's folders are hidden), an S3 server
(moto) for out_dir, the quickstart submitted with `ray job submit --working-dir`, killed mid-run, resumed
from the bucket, and compared with a local run."""
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import TESTS, free_port, s3_objects, stop_process_group

REPO = TESTS.parent
RAY = str(Path(sys.executable).with_name("ray"))




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
    modes = re.findall(r"RAY_AUTH_MODE=(\w+)", (REPO / "ray_cluster.yaml").read_text())
    assert modes and set(modes) == {"token"}  # token auth everywhere, never switched off
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


def _node(*args: str, env: dict, cwd: Path, hide: tuple[Path, ...] = ()) -> subprocess.Popen:
    """``ray start --block`` (its processes stay under one parent we can stop without touching other Ray
    instances) run in ``cwd``. ``hide``: folders this node must not see, covered by empty tmpfs mounts in a
    mount namespace of its own - what a second machine without shared disk sees of the head's files."""
    # Each node's agents get their own free ports: two nodes (and any other Ray) share this machine.
    ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                      "metrics-export-port", "runtime-env-agent-port")]
    command = [RAY, "start", "--block", *ports, *args]
    if hide:
        mounts = " && ".join(f"mount -t tmpfs fedsim-hidden {folder}" for folder in hide)
        command = ["unshare", "--mount", "sh", "-c", f'{mounts} && exec "$@"', "node", *command]
    return subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_nodes(address: str, count: int, env: dict) -> None:
    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='error'); "
             "print(sum(n['Alive'] for n in ray.nodes()))")
    deadline = time.time() + 180  # a loaded 2-core machine (CI beside other Ray work) starts a head slowly
    while time.time() < deadline:
        try:  # a probe that waits out its timeout (the head's GCS not up yet) is retried until the deadline
            out = subprocess.run([sys.executable, "-c", probe, address], env=env, capture_output=True, text=True,
                                 timeout=min(60.0, max(5.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            continue
        if out.returncode == 0 and out.stdout.strip().endswith(str(count)):
            return
        time.sleep(2)
    raise AssertionError(f"cluster at {address} never reached {count} nodes")


def _stop_cluster(nodes, gcs: int, folders) -> None:
    """Stop the nodes (those started), forget the head, remove the nodes' folders."""
    for node in nodes:
        if node is not None:
            stop_process_group(node)
    # `ray start` records the head for later `ray.init()` calls; do not leave a pointer to a dead cluster.
    pointer = Path("/tmp/ray/ray_current_cluster")
    if pointer.exists() and pointer.read_text().strip().endswith(f":{gcs}"):
        pointer.unlink()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


class Cluster:
    """Submit/stop/status through the head's job server, as a user does from a laptop."""

    def __init__(self, dashboard: int, env: dict):
        self.address, self.env = f"http://127.0.0.1:{dashboard}", env

    def submit(self, *entrypoint: str, runtime_env: dict) -> str:
        command = [RAY, "job", "submit", f"--address={self.address}", f"--working-dir={REPO}", "--no-wait",
                   f"--runtime-env-json={json.dumps(runtime_env)}", "--", *entrypoint]
        for _ in range(30):  # the head's job agent comes up some seconds after the node
            out = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=300)
            if "No available agent" not in out.stdout + out.stderr:
                break
            time.sleep(3)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return re.search(r"raysubmit_\w+", out.stdout + out.stderr).group(0)

    def _job(self, *args: str) -> str:
        out = subprocess.run([RAY, "job", *args, f"--address={self.address}"], env=self.env, capture_output=True,
                             text=True, timeout=300)
        return out.stdout + out.stderr

    def wait(self, job: str) -> str:
        """Block until the job ends; returns its final status: succeeded, failed or stopped."""
        deadline = time.time() + 600
        while time.time() < deadline:
            # `ray job status` ends with "Job '...' succeeded" / "failed" / "was stopped" once it is over.
            final = re.search(rf"Job '{job}' (?:was )?(succeeded|failed|stopped)", self._job("status", job))
            if final:
                return final.group(1)
            time.sleep(2)
        raise AssertionError(f"job {job} still running after 600 s")

    def stop(self, job: str) -> None:
        self._job("stop", job)

    def logs(self, job: str) -> str:
        return self._job("logs", job)[-4000:]


@pytest.mark.slow
def test_job_on_a_cluster_without_shared_disk_checkpoints_to_s3_resumes_and_matches_local_run(
        tmp_path, data_root, s3_bucket):
    overrides = ["sweep.algorithm=[fedper]", "train.rounds=4", "train.local_epochs=1", "data.train_fraction=0.02",
                 "data.test_fraction=0.05", "engine.round_timeout_s=300"]
    s3_env, s3 = s3_bucket
    env = {**cluster_env(data_root), **s3_env}
    local = subprocess.run([sys.executable, "-m", "fedsim.cli.main", "run", "experiments/quickstart.yaml", "--quiet",
                            *overrides, f"out_dir={tmp_path / 'local'}"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]

    # Short folders of their own: Ray's socket paths must stay under 108 characters.
    head_dir, second_dir = (Path(tempfile.mkdtemp(prefix=f"fs{n}-", dir="/tmp")) for n in (1, 2))
    for folder in (head_dir, second_dir):
        (folder / "cwd").mkdir()
    gcs, dashboard = free_port(), free_port()
    head = _node("--head", f"--port={gcs}", "--num-cpus=1", "--include-dashboard=true", f"--temp-dir={head_dir / 'ray'}",
                 "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", env=env, cwd=head_dir / "cwd")
    second = None
    api_key = "fedsim-test-key-" + secrets.token_hex(20)  # W&B offline never needs it; it must not be written anywhere
    runtime_env = {"env_vars": {**{k: env[k] for k in ("FEDSIM_DATA", "FEDSIM_CACHE") if k in env}, **s3_env,
                                "WANDB_API_KEY": api_key},
                   "excludes": [".venv", "runs", "wandb", ".git"]}
    entrypoint = [sys.executable, "-m", "fedsim.cli.main", "run", "--quiet"]
    try:
        _wait_for_nodes(f"127.0.0.1:{gcs}", 1, env)
        second = _node(f"--address=127.0.0.1:{gcs}", "--num-cpus=1", f"--temp-dir={second_dir / 'ray'}", env=env,
                       cwd=second_dir / "cwd", hide=(head_dir, tmp_path))
        _wait_for_nodes(f"127.0.0.1:{gcs}", 2, env)
        cluster = Cluster(dashboard, env)
        # A folder on the head is not shared with the second node: refused at start, naming out_dir.
        refused = cluster.submit(*entrypoint, "experiments/quickstart.yaml", *overrides, f"out_dir={head_dir / 'runs'}",
                                 runtime_env=runtime_env)
        assert cluster.wait(refused) == "failed"
        assert "fedsim: error: out_dir: " in cluster.logs(refused)
        assert "is not shared with 1 of the run's 2 nodes" in cluster.logs(refused)
        first = cluster.submit(*entrypoint, "experiments/quickstart.yaml", *overrides, "out_dir=s3://fedsim-runs/runs",
                               "logging.wandb.mode=offline", runtime_env=runtime_env)
        deadline = time.time() + 300  # kill it once its first checkpoint is in the bucket
        while b"round-0001" not in s3_objects(s3, "runs/quickstart-fedper/checkpoints/").get("latest", b""):
            assert time.time() < deadline, cluster.logs(first)
            time.sleep(0.3)
        cluster.stop(first)
        assert cluster.wait(first) == "stopped", cluster.logs(first)
        crashed = _rows(s3_objects(s3, "runs/quickstart-fedper/").get("rounds.jsonl", b"").decode())
        assert 1 <= len(crashed) < 4  # the kill came mid-run
        second_job = cluster.submit(*entrypoint, "--resume", "s3://fedsim-runs/runs/quickstart-fedper",
                                    runtime_env=runtime_env)
        assert cluster.wait(second_job) == "succeeded", cluster.logs(second_job)
    finally:
        _stop_cluster((second, head), gcs, (head_dir, second_dir))

    stored = s3_objects(s3, "runs/quickstart-fedper/")
    local_run = tmp_path / "local" / "quickstart-fedper"
    assert _rows(stored["metrics.jsonl"].decode()) == _rows((local_run / "metrics.jsonl").read_text())
    summary = json.loads(stored["summary.json"])
    assert len({w["node"] for w in summary["workers"]}) == 2  # one worker on each node
    # Every worker wrote its own shard to the bucket (the second node cannot see the head's disk).
    latest = stored["checkpoints/latest"].decode()
    assert latest == "round-0004"
    state = json.loads(stored[f"checkpoints/{latest}/state.json"])
    assert state["workers"] == ["worker-0.npz", "worker-1.npz"]
    assert all(f"checkpoints/{latest}/{name}" in stored for name in state["workers"])
    # W&B: both jobs' offline files landed, as one W&B run (the resumed job continued the same id).
    wandb_id = json.loads(stored["wandb_run.json"])["id"]
    runs = {name.split("/")[1] for name in stored if name.startswith("wandb/offline-run-")}
    assert len(runs) == 2 and all(run.endswith(f"-{wandb_id}") for run in runs), runs
    assert all(f"wandb/{run}/run-{wandb_id}.wandb" in stored for run in runs)
    assert not [name for name, data in stored.items() if api_key.encode() in data]  # the key stayed in the env


@pytest.mark.slow
def test_a_sweep_on_the_two_node_cluster_runs_its_two_trials_on_different_nodes(tmp_path, data_root):
    """Each trial's placement group packs its workers onto one node: two trials that each fill a node run at once,
    one per node (that a trial equals its run alone is tests/sweep's; that a run across nodes equals a local one,
    the test above)."""
    from conftest import synthetic_tree, write_yaml

    env = {**cluster_env(data_root), "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    tree = synthetic_tree(tmp_path, "nodes", **{"train.rounds": 2}, sweep={"algorithm": ["fedavg", "fedper"]})
    config = write_yaml(tmp_path / "nodes.yaml", tree)
    head_dir, second_dir = (Path(tempfile.mkdtemp(prefix=f"fs{n}-", dir="/tmp")) for n in (3, 4))
    gcs = free_port()
    head = _node("--head", f"--port={gcs}", "--num-cpus=2", "--include-dashboard=false",
                 f"--temp-dir={head_dir / 'ray'}", env=env, cwd=head_dir)
    second = None
    try:
        _wait_for_nodes(f"127.0.0.1:{gcs}", 1, env)
        second = _node(f"--address=127.0.0.1:{gcs}", "--num-cpus=2", f"--temp-dir={second_dir / 'ray'}", env=env,
                       cwd=second_dir)
        _wait_for_nodes(f"127.0.0.1:{gcs}", 2, env)
        proc = subprocess.run([sys.executable, "-m", "fedsim.cli.main", "sweep", str(config), "--max-concurrent", "2"],
                              env={**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}"}, cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        _stop_cluster((second, head), gcs, (head_dir, second_dir))
    nodes = [{w["node"] for w in json.loads((tmp_path / f"nodes-{m}" / "summary.json").read_text())["workers"]}
             for m in ("fedavg", "fedper")]
    assert all(len(n) == 1 for n in nodes) and nodes[0] != nodes[1], nodes
