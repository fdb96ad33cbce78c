"""Chaos soak: tiny runs disturbed at a random moment, then resumed until they finish; every finished
run's per-client metrics must equal an undisturbed run's bit for bit.

Each trial starts `fedsim run` (its own local Ray), waits a random time, and injects one fault:
  kill_cli     SIGKILL the CLI process (its Ray head goes with it)
  kill_server  SIGKILL the server/driver actor's process
  kill_worker  SIGKILL one worker process (the run should recover by itself)
  stop_worker  SIGSTOP one worker process (frozen, not dead)
  disk_full    fill the small tmpfs the run writes to (root only; skipped, and said so, elsewhere)
Then it waits for the CLI to exit, kills whatever the trial left behind (only processes of the
trial's own session), frees the disk, and runs `fedsim run --resume` until exit code 0. A run
folder the kill left without a config (killed while starting) is started again with --overwrite,
as a user would. The trial survives when the final metrics.jsonl and summary's per-client
accuracies equal the reference run's.

Progress is kept in STATE (JSON), so an interrupted soak continues where it stopped:
    python benchmarks/chaos.py --trials 100 --work /tmp/fedsim-chaos [--system async]
prints `survived S / run N` and exits 0 only when every trial survived.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FAULTS = ("kill_cli", "kill_server", "kill_worker", "stop_worker", "disk_full")
SERVER_TITLES = (b"ray::Server", b"ray::Driver")  # the actor's class name: Server since issue 10, Driver before
WORKER_TITLES = (b"ray::Worker",)
RUN_TIMEOUT_S = 300  # a CLI that has not exited by then counts as hung: the trial fails
DISK_MB = 64  # the tmpfs the runs write to; a run folder of this config is well under 1 MB

# The smallest config that still goes through Ray workers: synthetic features, an MLP, 2 workers, a few rounds,
# a checkpoint every round. A short heartbeat timeout bounds how long a frozen worker stalls a run.
CONFIG = {
    "seed": 3, "algorithm": "fedper",
    "data": {"dataset": "synthetic", "partition": "natural", "num_clients": 8,
             "options": {"num_clients": 8, "alpha": 0.5, "beta": 0.5}},
    "model": {"name": "mlp", "personal_layers": 1},
    "train": {"rounds": 5, "local_epochs": 1, "batch_size": 10, "fraction": 0.5, "eval_every": 2},
    "eval": {"finetune_epochs": 1},
    "engine": {"workers": 2, "checkpoint_every": 1, "round_timeout_s": 120, "heartbeat_timeout_s": 10},
}
# --system async: the same run as FedBuff on a heterogeneous clock (docs/system.md): stale updates, dropouts,
# and older models the server must carry through every checkpoint.
SYSTEMS = {"ideal": {}, "async": {"system": {"devices": {"preset": "lognormal", "sigma": 1.0}, "dropout": 0.2,
                                             "mode": "async", "async_buffer": 2, "concurrency": 4}}}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), WANDB_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env.setdefault("FEDSIM_DATA", str(REPO.parent / "shared" / "datasets"))
    return env


LIVE_SESSIONS: set[int] = set()  # trial sessions not yet cleaned up: killed if the soak itself is stopped


def fedsim(*args: str) -> subprocess.Popen:
    """`fedsim ...` in a session of its own, so the trial can find (and clean up) exactly its processes."""
    proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", *args, "--quiet"], env=_env(), cwd=REPO,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    LIVE_SESSIONS.add(proc.pid)
    return proc


def session_pids(sid: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getsid(int(proc.name)) == sid:
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def titled(sid: int, titles: tuple[bytes, ...]) -> list[int]:
    found = []
    for pid in session_pids(sid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(titles):
                found.append(pid)
        except OSError:
            continue
    return sorted(found)


def kill_session(sid: int) -> None:
    """SIGKILL every process left in the trial's session (a stopped one too), then wait until they are gone."""
    for _ in range(50):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


@contextlib.contextmanager
def small_disk(path: Path):
    """A DISK_MB tmpfs at ``path`` when this process may mount (root); else a plain folder and no disk faults."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        for sid in list(LIVE_SESSIONS):  # a trial interrupted by SIGTERM or Ctrl-C
            kill_session(sid)
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as f:  # ENOSPC ends it, close included
        while True:
            f.write(b"\0" * (1 << 20))
    return filler


def inject(fault: str, proc: subprocess.Popen, disk: Path) -> str:
    """Apply ``fault`` to the running trial; returns what was done (for the log)."""
    sid = proc.pid
    if fault == "kill_cli":
        os.kill(proc.pid, signal.SIGKILL)
        return f"SIGKILL cli {proc.pid}"
    if fault == "disk_full":
        fill(disk)
        return "disk full"
    titles = SERVER_TITLES if fault == "kill_server" else WORKER_TITLES
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        targets = titled(sid, titles)
        if targets:
            victim = random.choice(targets)
            os.kill(victim, signal.SIGSTOP if fault == "stop_worker" else signal.SIGKILL)
            return f"{'SIGSTOP' if fault == 'stop_worker' else 'SIGKILL'} {titles[0].decode()} {victim}"
        time.sleep(0.05)
    return "target never appeared (run ended first)"


def finish(proc: subprocess.Popen) -> tuple[int | None, str]:
    """Wait for the CLI; returns (exit code or None when hung, its error line, else its last stderr line)."""
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        code = None
    kill_session(proc.pid)
    LIVE_SESSIONS.discard(proc.pid)
    lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("fedsim: error:")]
    return code, (errors or lines or [""])[-1]


def per_client_metrics(run_dir: Path) -> tuple[list[dict], dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return rows, summary.get("per_client_acc", {})


def trial(k: int, fault: str, delay: float, disk: Path, reference: tuple, config: dict) -> dict:
    run_dir = disk / f"trial-{k}"
    cfg_path = disk / f"trial-{k}.yaml"
    cfg_path.write_text(yaml.safe_dump({**config, "name": run_dir.name, "out_dir": str(disk)}))
    proc = fedsim("run", str(cfg_path), "--overwrite")
    time.sleep(delay)
    done = inject(fault, proc, disk) if proc.poll() is None else "run ended before the fault"
    code, last = finish(proc)
    log = {"trial": k, "fault": fault, "delay_s": round(delay, 2), "injected": done, "exits": [code], "last": [last]}
    (disk / "filler").unlink(missing_ok=True)
    for _ in range(5):
        if code == 0:
            break
        fresh = not (run_dir / "config.yaml").is_file()  # killed before the run folder was complete
        code, last = finish(fedsim("run", str(cfg_path), "--overwrite") if fresh else fedsim("run", "--resume", str(run_dir)))
        log["exits"].append(code)
        log["last"].append(last)
    log["survived"] = code == 0 and per_client_metrics(run_dir) == reference
    if log["survived"]:
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg_path.unlink(missing_ok=True)
    return log


def main() -> int:
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the tmpfs is unmounted on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("/tmp/fedsim-chaos"), help="state and run folders")
    parser.add_argument("--seed", type=int, default=0, help="draws the faults and their moments")
    parser.add_argument("--system", choices=SYSTEMS, default="ideal", help="ideal: the plain run; async: FedBuff "
                        "on a heterogeneous virtual clock")
    parser.add_argument("--smoke", action="store_true", help="one trial in a fresh temporary --work: checks that the "
                        "script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if not args.smoke:
        return soak(args)
    with tempfile.TemporaryDirectory(prefix="fedsim-chaos-smoke-") as work:  # removed with what the smoke run wrote
        args.trials, args.work = 1, Path(work)
        return soak(args)


def soak(args: argparse.Namespace) -> int:
    """``args.trials`` faults, each in a run of its own, against the reference run; resumable from ``args.work``."""
    config = {**CONFIG, **SYSTEMS[args.system]}
    args.work.mkdir(parents=True, exist_ok=True)
    state_path = args.work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"trials": [], "system": args.system}
    if state.get("system", "ideal") != args.system:
        print(f"{state_path} holds a soak of --system {state.get('system', 'ideal')}; give another --work")
        return 2
    with small_disk(args.work / "disk") as can_fill:
        disk = args.work / "disk"
        reference_dir = args.work / "reference"
        if not (reference_dir / "summary.json").is_file():
            shutil.rmtree(reference_dir, ignore_errors=True)
            (args.work / "reference.yaml").write_text(yaml.safe_dump({**config, "name": "reference",
                                                                      "out_dir": str(args.work)}))
            started = time.time()
            code, last = finish(fedsim("run", str(args.work / "reference.yaml")))
            if code != 0:
                print(f"reference run failed (exit {code}): {last}")
                return 1
            state["reference_s"] = round(time.time() - started, 1)
        reference = per_client_metrics(reference_dir)
        faults = FAULTS if can_fill else tuple(f for f in FAULTS if f != "disk_full")
        if not can_fill:
            print("disk_full faults skipped: cannot mount a tmpfs here (needs root)")
        for k in range(len(state["trials"]), args.trials):
            rng = random.Random(args.seed * 1_000_003 + k)
            fault, delay = rng.choice(faults), rng.uniform(0, state["reference_s"])
            random.seed(rng.random())  # which worker is hit
            log = trial(k, fault, delay, disk, reference, config)
            state["trials"].append(log)
            state_path.write_text(json.dumps(state, indent=1))
            print(json.dumps(log), flush=True)
    survived = sum(t["survived"] for t in state["trials"][:args.trials])
    ran = len(state["trials"][:args.trials])
    print(f"survived {survived} / run {ran}")
    return 0 if survived == ran == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
