"""Builders every test shares: configs, client runtimes, run-folder readers, a local Ray."""
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fedsim  # noqa: F401  - sets Ray's local-run defaults (loopback, token auth) before any test imports ray

os.environ.setdefault("WANDB_MODE", "offline")

TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """The hostile-input suite's counts (tests/hostile/conftest.py), registered here: this conftest is loaded by
    every pytest process, xdist's controller included, which prints the summary but never collects tests/hostile."""
    from hostile.conftest import HostileTally

    config.pluginmanager.register(HostileTally(), "hostile-tally")


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The shared real data (FEDSIM_DATA). `make test` sets it; without it, data tests skip."""
    root = os.environ.get("FEDSIM_DATA")
    if not root or not (Path(root) / "cifar10-jpeg.zip").exists():
        pytest.skip("set FEDSIM_DATA to the folder holding cifar10-jpeg.zip (make test does this)")
    return Path(root)


_SHARED_RAY: dict[str, str] = {}  # the GCS address of the Ray that local_ray started, while it runs


@pytest.fixture(scope="session")
def _shared_ray_session():
    yield
    import ray

    ray.shutdown()


@pytest.fixture(scope="module")
def local_ray(_shared_ray_session):
    """A local Ray with 2 CPUs, shared by every module that asks for it: a start cost 8-11 s a module (measured),
    so it stays up until the session ends. Any other Ray still up (one a run started for itself) is stopped first;
    a test that needs its own Ray, or none, asks for ``no_ray``."""
    import ray

    _keep_ray()  # also for a module-scoped fixture that builds its run before the test's own fixtures are set up

    if ray.is_initialized() and _SHARED_RAY.get("gcs") == ray.get_runtime_context().gcs_address:
        return ray
    ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    _SHARED_RAY["gcs"] = ray.get_runtime_context().gcs_address
    return ray


@pytest.fixture
def no_ray():
    """No Ray is up when the test starts: the shared one is stopped (the next ``local_ray`` starts it again)."""
    import ray

    _keep_ray()

    ray.shutdown()
    _SHARED_RAY.clear()


_RAY_WANTED = False  # whether the running test's runs take Ray by default (set by _engine_of_the_test)


def _keep_ray() -> None:
    global _RAY_WANTED
    _RAY_WANTED = True


@pytest.fixture(autouse=True)
def _engine_of_the_test(request):
    """A test that asks for a Ray (``local_ray``, ``no_ray``) or is slow (the cluster, chaos and signal scenarios)
    keeps Ray for the runs the builders below make; every other one runs them on the local backend, one worker in
    the test's own process, without Ray's start-up (10-30 s a run)."""
    global _RAY_WANTED
    _RAY_WANTED = bool({"local_ray", "no_ray"} & set(request.fixturenames)) or bool(request.node.get_closest_marker("slow"))
    yield
    _RAY_WANTED = False


def engine_default(tree: dict, over: dict) -> dict:
    """``tree`` on the local backend with one worker, unless ``over`` names engine.backend or more than one worker
    (engine.workers > 1 runs on Ray) or the test keeps Ray (``_engine_of_the_test``)."""
    asked = {key.replace("__", ".") for key in over}
    engine = tree["engine"]
    if "engine.backend" in asked or _RAY_WANTED or ("engine.workers" in asked and engine["workers"] > 1):
        return tree
    engine.update(backend="local", workers=1)
    return tree


def set_dotted(tree: dict, dotted: str, value) -> dict:
    """``set_dotted(tree, "train.rounds", 3)``; ``__`` also separates (for keyword arguments)."""
    from fedsim.config import set_dotted as set_key

    set_key(tree, dotted.replace("__", "."), value)
    return tree


def small_tree(tmp_path, data_root, **over) -> dict:
    """A run of a few CIFAR-10 clients with a few images each; ``over``: ``train__rounds=3`` style."""
    tree = {
        "name": "t", "seed": 1, "algorithm": "fedper", "out_dir": str(tmp_path),
        "data": {"dataset": "cifar10", "root": str(data_root), "num_clients": 5, "partition": "classes", "k": 2,
                 "train_fraction": 0.02, "test_fraction": 0.05},
        "model": {"name": "cnn4", "personal_layers": 1},
        "train": {"rounds": 2, "local_epochs": 1, "batch_size": 50},
        "eval": {"finetune_epochs": 0},
        "engine": {"workers": 2, "round_timeout_s": 300},
    }
    for dotted, value in over.items():
        set_dotted(tree, dotted, value)
    return engine_default(tree, over)


def small_config(tmp_path, data_root, **over):
    from fedsim.config import validate

    return validate(small_tree(tmp_path, data_root, **over))


def plan_for(cfg, partition=None):
    """The run plan the driver would build for ``cfg`` (over ``partition``, default the config's own)."""
    from fedsim.plan.build import build_plan, load_inputs

    return build_plan(cfg, load_inputs(cfg), partition)


def accounting_of(plan):
    """The accountant's view of ``plan``'s run, as RunPlan.privacy was derived from it (None without DP)."""
    from fedsim.plan.privacy import run_accounting

    return run_accounting(plan.cfg, plan.population.trainable, plan.population.cohort)


def client_runtime(data_root, algorithm, *, seed=3, clients=5, **over):
    """A worker's runtime over ``clients`` CIFAR-10 clients (k = 2), without Ray."""
    from fedsim.client.runtime import ClientRuntime

    settings = dict(seed=seed, algorithm=algorithm, data__num_clients=clients, data__train_fraction=0.01,
                    data__test_fraction=0.02, train__batch_size=25, eval__finetune_epochs=2)
    plan = plan_for(small_config("unused", data_root, **{**settings, **over}))
    return ClientRuntime(plan.for_workers(), dict(enumerate(plan.clients)))


def each_round(fn):
    """A callback of the driver loop that calls ``fn(result)`` after every completed round."""
    from fedsim.engine.driver import Callback

    class EachRound(Callback):
        def on_round_end(self, run, result) -> None:
            fn(result)

    return EachRound()


def train_one(rt, broadcast: dict, client: int, round_idx: int) -> tuple[dict, float]:
    """One client's round on a worker runtime, kept as the engine keeps a client whose loss is finite:
    (its uploads as numpy vectors, its loss)."""
    trained = rt.train_client(broadcast, client, round_idx)
    loss = float(trained.loss)
    if np.isfinite(loss):
        rt.keep(client, trained)
    return {name: v.cpu().numpy() for name, v in trained.uploads.items()}, loss


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def per_client(run_dir: Path) -> list[dict]:
    """Every per-client evaluation record of a run, in file order."""
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


def synthetic_tree(tmp_path, name: str = "t", **over) -> dict:
    """A run on 8 generated clients with an MLP: seconds of compute (on the local backend unless the test keeps
    Ray: ``engine_default``)."""
    tree = {
        "name": name, "seed": 3, "algorithm": "fedper", "out_dir": str(tmp_path),
        "data": {"dataset": "synthetic", "partition": "natural", "num_clients": 8, "options": {"num_clients": 8}},
        "model": {"name": "mlp", "personal_layers": 1},
        "train": {"rounds": 4, "local_epochs": 1, "batch_size": 10, "fraction": 0.5, "eval_every": 2},
        "eval": {"finetune_epochs": 1},
        "engine": {"workers": 2, "round_timeout_s": 300},
    }
    for dotted, value in over.items():
        set_dotted(tree, dotted, value)
    return engine_default(tree, over)


def tune_tree(tmp_path, name="tn", **over):
    """A tuning config over the synthetic run: 3 methods x 3 trials x 2 seeds of 1 round, 2 final seeds."""
    tune = {"methods": ["fedavg", "fedprox", "ditto"], "trials": 3, "rounds": 1, "seeds": [0, 1], "final_seeds": 2,
            "space": {"lr": {"loguniform": [0.01, 0.1]}, "momentum": {"choice": [0.0, 0.9]}}}
    tree = synthetic_tree(tmp_path, name, **{"data.validation": 0.2, "engine.workers": 1, "train.eval_every": 1})
    tree["tune"] = {**tune, **over}
    return tree


def own_ray_pids(title: bytes) -> list[int]:
    """Processes Ray titled ``title...`` (e.g. b"ray::Worker") that descend from this test process, never
    another Ray on the machine."""
    def descends(pid: int) -> bool:
        for _ in range(6):
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            if pid == os.getpid():
                return True
        return False

    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(title):
                found.append(int(proc.name))
        except OSError:
            continue
    return sorted(p for p in found if descends(p))


class _Call:
    def __init__(self, method):
        self.remote = method  # runs at once; the result stands in for the ObjectRef


class InProcessWorker:
    """A worker actor handle that runs its ClientRuntime in this process (``handle.evaluate.remote(...)``)."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.ping = _Call(os.getpid)  # the actor shell answers pings itself (fedsim.client.worker)
        # The shell's CPU account: 0 here, where the clients train in the server's own process, whose CPU time the
        # round already counts.
        self.cpu_seconds = _Call(lambda: 0.0)

    def __getattr__(self, name):
        return _Call(getattr(self.runtime, name))


def in_process_server(cfg, partition=None):
    """The engine's real Server over ``cfg.engine.workers`` in-process workers: what Ray would run, minus
    the processes, so worker-count invariance can be checked for every method in seconds. Its calls
    (``server.pool.calls``, the local backend's) are its own: a test may patch them."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.engine.backend import InProcessCalls
    from fedsim.engine.server import Server

    plan = plan_for(cfg, partition)
    workers_plan = plan.for_workers()

    def spawn(clients, bundle=None):
        return InProcessWorker(ClientRuntime(workers_plan, clients))

    return Server(plan, [spawn(clients) for clients in plan.assignments], spawn, None, InProcessCalls())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM a process started with start_new_session=True and everything it started; SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


S3_BUCKET = "fedsim-runs"


@pytest.fixture
def s3_bucket(monkeypatch):
    """A moto S3 server on a loopback port with one bucket, reachable from this process (pyarrow reads
    AWS_ENDPOINT_URL); yields (the environment that reaches it, a boto3 client)."""
    pytest.importorskip("moto", reason="moto[server] is a dev dependency: pip install -e '.[dev]'")
    import boto3

    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "fedsim-test",
           "AWS_SECRET_ACCESS_KEY": "fedsim-test", "AWS_DEFAULT_REGION": "us-east-1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        deadline = time.time() + 60
        while True:
            try:
                s3.create_bucket(Bucket=S3_BUCKET)
                break
            except Exception:  # the server is still starting
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.5)
        yield env, s3
    finally:
        stop_process_group(server)


def s3_objects(s3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` in the test bucket, by key relative to it."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix)
    keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    return {key[len(prefix):]: s3.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read() for key in keys}


def six_client_run(tmp_path, data_root, algorithm, workers: int, rounds: int = 2, eval_every: int | None = None,
                   system: dict | None = None, validation: float = 0.0, **engine):
    """The config of a 6-client CIFAR-10 run small enough to repeat per method and worker count; ``engine``:
    engine settings such as ``state_ram_mb=0``; ``system``: the system section (the virtual clock); ``validation``:
    data.validation."""
    return small_config(tmp_path, data_root, algorithm=algorithm, seed=4, data__num_clients=6, data__k=3,
                        data__validation=validation,
                        data__train_fraction=0.006, data__test_fraction=0.02, train__rounds=rounds,
                        train__eval_every=eval_every or rounds, train__fraction=0.5, train__batch_size=20,
                        eval__finetune_epochs=1, engine__workers=workers, engine__cpus_per_worker=0.5,
                        **({"system": system} if system else {}),
                        **{f"engine__{key}": value for key, value in engine.items()})


def round_records(outcomes) -> list:
    """What must match between two runs of the same rounds: sampling, per-client records, traffic."""
    return [(o.round, o.sampled, o.records, o.comm) for o in outcomes]


def write_csv(tmp_path: Path, name: str, text: str) -> str:
    """A CSV file (a device or availability trace) in tmp_path, as the path a config names."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def make_image_zip(path: Path, seed: int = 0, extra: dict[str, bytes] | None = None,
                   blue: int | None = None) -> None:
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(path, "w") as z:
        for split in ("train", "test"):
            for cls in ("cat", "dog"):
                for i in range(3):
                    pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                    if blue is not None:
                        pixels[..., 2] = blue
                    z.writestr(f"{split}/{cls}/{i}.png", png(pixels))
        for name, data in (extra or {}).items():
            z.writestr(name, data)


def make_run(root: Path, name: str, algorithm: str, acc: list[list[float]],
             personalized: list[list[float]] | None = None, bytes_round: tuple[int, int] = (0, 0),
             legacy: bool = False, seed: int = 0) -> Path:
    """A run folder as `fedsim run` writes it: acc[r][c] is client c's accuracy at round r + 1; bytes_round is
    (down, up) per client per round. legacy: an older run, without bytes_down, comm.jsonl or summary comm."""
    from fedsim.metrics.summary import summarize

    run_dir = root / name
    run_dir.mkdir(parents=True)
    clients = range(len(acc[0]))
    (run_dir / "config.yaml").write_text(f"name: {name}\nseed: {seed}\nalgorithm: {algorithm}\ntrain:\n  rounds: {len(acc)}\n")
    (run_dir / "partition_stats.json").write_text(json.dumps({"num_clients": len(acc[0])}))
    metrics, rounds, comm = [], [], []
    for r, accs in enumerate(acc, start=1):
        recs = [{"round": r, "client": c, "n_train": 50, "n_test": 20, "loss": 1.0, "acc": accs[c], "train_loss": 0.5}
                for c in clients]
        if personalized:
            for rec in recs:
                rec.update(loss_personalized=0.8, acc_personalized=personalized[r - 1][rec["client"]])
        metrics += recs
        down, up = bytes_round
        row = {"round": r, "seconds": 1.0, "sampled": len(recs), "bytes_up": up * len(recs),
               "acc": summarize(accs)}
        if not legacy:
            row["bytes_down"] = down * len(recs)
            comm += [{"round": r, "client": c, "bytes_down": down, "bytes_up": up} for c in clients]
        rounds.append(row)
    for filename, rows in (("metrics.jsonl", metrics), ("rounds.jsonl", rounds), ("comm.jsonl", comm)):
        (run_dir / filename).write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = {"name": name, "algorithm": algorithm, "rounds": len(acc), "acc": summarize(acc[-1]),
               "per_client_acc": dict(zip(map(str, clients), acc[-1])), "wall_seconds": 12.5}
    if personalized:
        summary["acc_personalized"] = summarize(personalized[-1])
    if not legacy:
        summary["comm"] = {"bytes_down": sum(r["bytes_down"] for r in rounds),
                           "bytes_up": sum(r["bytes_up"] for r in rounds)}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def two_runs(root: Path) -> list[Path]:
    # 4 clients, 2 rounds. FedAvg sends 10 MB in all (6 down + 4 up), FedPer 7 MB: a 30% saving.
    fedavg = make_run(root, "fedavg-run", "fedavg", [[0.1, 0.2, 0.3, 0.4], [0.2, 0.4, 0.6, 0.8]],
                      bytes_round=(750_000, 500_000))
    fedper = make_run(root, "fedper-run", "fedper", [[0.5, 0.5, 0.6, 0.6], [0.7, 0.7, 0.8, 0.8]],
                      personalized=[[0.8] * 4, [0.9] * 4], bytes_round=(500_000, 375_000))
    return [fedavg, fedper]


def lightning_tree(tmp_path, client: str, algorithm: str = "fedper", **over) -> dict:
    """A run of a user's own LightningModule (tests/user_plugins.py) on four clients of Gaussian blobs: seconds."""
    tree = {"name": "lm", "seed": 2, "out_dir": str(tmp_path), "algorithm": algorithm,
            "data": {"dataset": "user_plugins:blobs", "partition": "user_plugins:round_robin", "num_clients": 4,
                     "augment": False},
            "model": {"client": f"user_plugins:{client}"},
            "train": {"rounds": 2, "local_epochs": 2, "batch_size": 20, "fraction": 0.5, "eval_every": 1},
            "eval": {"finetune_epochs": 1}, "engine": {"workers": 2, "round_timeout_s": 300}}
    for dotted, value in over.items():
        set_dotted(tree, dotted, value)
    return engine_default(tree, over)


def lightning_runtime(tmp_path, client: str, algorithm: str = "fedper", **over):
    """A worker's runtime (without Ray) over every client of ``lightning_tree``."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.config import validate

    plan = plan_for(validate(lightning_tree(tmp_path, client, algorithm, **over)))
    return ClientRuntime(plan, dict(enumerate(plan.clients)))


def cli_env(**extra: str) -> dict:
    """The environment of a `fedsim` subprocess: tests/ importable (user_plugins), W&B off unless asked."""
    return {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "WANDB_MODE": "disabled",
            **extra}


def fedsim_cli(*args: str, timeout: float = 600, **popen) -> subprocess.CompletedProcess:
    """`python -m fedsim.cli.main ARGS` to completion, output captured."""
    return subprocess.run([sys.executable, "-m", "fedsim.cli.main", *args], env=popen.pop("env", cli_env()),
                          capture_output=True, text=True, timeout=timeout, **popen)


def crash_mid_run(config: Path, run_dir: Path, after_rounds: int) -> int:
    """`fedsim run CONFIG` in a process of its own, killed with its Ray head and workers (SIGKILL: nothing gets to
    clean up) once ``after_rounds`` rounds are in its rounds.jsonl; the rounds it had finished."""
    proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", "run", str(config), "--quiet"], env=cli_env(),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rows = run_dir / "rounds.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not rows.exists() or len(rows.read_text().splitlines()) < after_rounds):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.stdout is not None
    finished = len(rows.read_text().splitlines()) if rows.exists() else 0
    assert finished >= after_rounds, proc.stdout.read().decode()[-2000:]
    return finished


def write_yaml(path: Path, tree: dict) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree))
    return path


def finished_leaderboard_run(item, test: float, validation: float, per_client: int = 2) -> None:
    """A finished leaderboard run folder (a ``PlannedRun``'s) as the engine leaves it, as far as the leaderboard
    reads it: config.yaml, summary.json (test and validation at the final round), rounds.jsonl and metrics.jsonl
    (one row per client per evaluated round, each at the final round's accuracies)."""
    import yaml

    from fedsim.metrics.summary import summarize

    cfg, folder = item.config, item.folder
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    metric = "acc_personalized" if cfg.eval.finetune_epochs else "acc"
    tests, vals = [test] * per_client, [validation] * per_client
    best = {"round": cfg.train.rounds, **summarize(tests), "picked_on": "validation",
            "validation": summarize(vals)}
    (folder / "summary.json").write_text(json.dumps({
        "rounds": cfg.train.rounds, metric: summarize(tests), f"validation_{metric}": summarize(vals),
        "best_round": {metric: best}}))
    (folder / "rounds.jsonl").write_text("".join(json.dumps({"round": r, "seconds": 1.0, "cpu_seconds": 0.5,
                                                             "cpu_counted_once": True}) + "\n"
                                                 for r in range(1, cfg.train.rounds + 1)))
    evaluated = [r for r in range(1, cfg.train.rounds + 1) if r % cfg.train.eval_every == 0 or r == cfg.train.rounds]
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"client": c, "round": r, "n_train": 100, "n_test": 10, metric: test,
                    f"validation_{metric}": validation}) + "\n" for r in evaluated for c in range(per_client)))


def paper_folder(tmp_path: Path, key: str, edit: Callable[[str], str] = lambda text: text,
                 file: str = "claims.yaml") -> Path:
    """A copy of a shipped paper's folder (fedsim/reproduce/papers/<key>/) under ``tmp_path``, with ``edit`` applied
    to the text of one of its files: a paper's data as a test changes it."""
    import shutil

    from fedsim.reproduce.paper_files import PAPERS_DIR

    folder = shutil.copytree(PAPERS_DIR / key, tmp_path / key)
    (folder / file).write_text(edit((folder / file).read_text()))
    return folder


SHAKESPEARE_OPTIONS = {"plays": ["hamlet"], "min_chars": 9000}  # Hamlet's four longest parts: one play's parse


# Three plays' eight main speakers each (hamlet, macbeth, othello: 2,352 speeches; built in 1.3 s).
SPEAKERS_OPTIONS = {"plays": ["hamlet", "macbeth", "othello"]}


def speakers_tree(tmp_path, data_root, **over) -> dict:
    """A run of the three plays' speaker attribution on a test-sized token model, without Ray: seconds."""
    tree = {"name": "spk", "seed": 5, "algorithm": "fedper", "out_dir": str(tmp_path),
            "data": {"dataset": "shakespeare_speakers", "root": str(data_root), "partition": "natural",
                     "num_clients": 3, "options": dict(SPEAKERS_OPTIONS), "train_fraction": 0.1, "augment": False},
            "model": {"name": "user_plugins:tiny_token_bag", "personal_layers": 1},
            "train": {"rounds": 2, "local_epochs": 1, "batch_size": 16, "eval_every": 1},
            "eval": {"finetune_epochs": 0}, "engine": {"backend": "local", "workers": 1}}
    for dotted, value in over.items():
        set_dotted(tree, dotted, value)
    return tree


def shakespeare_tree(tmp_path, data_root, model: str = "user_plugins:tiny_char_lstm", **over) -> dict:
    """A run of 3 Hamlet characters on a tiny character model, a few hundred windows each: seconds."""
    tree = {"name": "shk", "seed": 5, "algorithm": "fedper", "out_dir": str(tmp_path),
            "data": {"dataset": "shakespeare", "root": str(data_root), "partition": "natural", "num_clients": 3,
                     "options": dict(SHAKESPEARE_OPTIONS), "train_fraction": 0.01, "test_fraction": 0.02,
                     "augment": False},
            "model": {"name": model, "personal_layers": 1},
            "train": {"rounds": 2, "local_epochs": 1, "batch_size": 32, "eval_every": 1},
            "eval": {"finetune_epochs": 0}, "engine": {"workers": 1, "round_timeout_s": 300}}
    for dotted, value in over.items():
        set_dotted(tree, dotted, value)
    return engine_default(tree, over)


# -- the hostile-input suite's probes (tests/hostile) ---------------------------------------------------------------
PROBE_BASE = {"name": "probe", "seed": 3, "algorithm": "fedper",
              "data": {"dataset": "synthetic", "partition": "natural", "num_clients": 8, "options": {"num_clients": 8}},
              "model": {"name": "mlp", "personal_layers": 1},
              "train": {"rounds": 2, "local_epochs": 1, "batch_size": 10, "fraction": 0.5},
              "eval": {"finetune_epochs": 0}, "engine": {"workers": 1}}


def write_probe(tmp_path: Path, extra: str = "", name: str = "cfg.yaml", **dotted) -> Path:
    """The synthetic PROBE_BASE, out_dir inside tmp_path, with ``extra`` (YAML sections merged over it) and ``dotted``
    (``engine__spill_dir=...``) set."""
    import copy

    import yaml

    from fedsim.config import merge_trees

    tree = merge_trees({**copy.deepcopy(PROBE_BASE), "out_dir": str(tmp_path / "runs")},
                       yaml.safe_load(extra) if extra else {})
    for key, value in dotted.items():
        set_dotted(tree, key, value)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return path


def refused(capsys, tmp_path: Path, argv: list[str], fragment: str) -> str:
    """`fedsim ARGV` in-process: exit 2, one line holding ``fragment``, no run folder, nothing new in tmp_path."""
    from fedsim.cli.main import main

    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fedsim: error: ") and fragment in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no runs/, nothing written beside the config
    return err


def unblocking(fifo: Path) -> threading.Timer:
    """Should a probe open ``fifo`` for reading after all, a writer opens and closes it within seconds, so the probe
    fails on an empty file instead of hanging the suite."""
    def release() -> None:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader: nothing to release
    timer = threading.Timer(5.0, release)
    timer.start()
    return timer


def minilm_tree(tmp_path, algorithm: str = "fedavg", **over) -> dict:
    """A run of 3 clients on a handful of short token sequences (user_plugins:token_sequences) with minilm."""
    tree = {"name": "lora", "seed": 4, "algorithm": algorithm, "out_dir": str(tmp_path),
            "data": {"dataset": "user_plugins:token_sequences", "partition": "natural", "num_clients": 3,
                     "augment": False},
            "model": {"name": "minilm", "options": {"r": 4}},
            "train": {"rounds": 1, "local_epochs": 1, "batch_size": 4, "eval_every": 1,
                      "body": {"lr": 0.05}, "head": {"lr": 0.05}},
            "eval": {"finetune_epochs": 0}, "engine": {"workers": 1, "round_timeout_s": 300}}
    for dotted, value in over.items():
        set_dotted(tree, dotted, value)
    return engine_default(tree, over)
