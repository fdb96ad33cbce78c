"""Signals and leftovers (issue 47, item 9): SIGINT or SIGTERM at any moment, Ray's start included, gives fedsim's
one line, exit 130 / 143, and leaves no process of the run alive; a run interrupted before it wrote its folder says
so; every local run removes the Ray session folder it created; a full disk is named as such; `fedsim report` refuses
a results file that is one endless line, reading a bounded amount of it."""
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from conftest import cli_env, fedsim_cli, synthetic_tree, write_yaml


@pytest.fixture
def ray_tmp():
    """A private TMPDIR for the CLI's Ray (its session folders land in ``ray_tmp/ray``), short enough for Ray's
    socket paths; every process that inherits it is the run's."""
    folder = Path(tempfile.mkdtemp(prefix="fsig", dir="/tmp"))
    yield folder
    for proc in _processes_of(folder):  # a probe that did not hold must not leave its Ray running
        proc.kill()
    shutil.rmtree(folder, ignore_errors=True)


def _processes_of(ray_tmp: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TMPDIR") == str(ray_tmp):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _survivors(ray_tmp: Path, wait_s: float = 10.0) -> list[str]:
    """The run's processes still alive ``wait_s`` after the CLI exited (Ray's own shutdown takes a few seconds)."""
    deadline = time.monotonic() + wait_s
    while (alive := _processes_of(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [" ".join(p.cmdline()[:2]) for p in alive if p.is_running()]


def _sessions(ray_tmp: Path) -> list[str]:
    root = ray_tmp / "ray"
    return sorted(p.name for p in root.iterdir() if p.name.startswith("session_")) if root.exists() else []


def _interruptible() -> None:
    """SIGINT back to its default in the child: a suite started in the background by a shell without job control
    (`cmd &`, nohup) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt for it (measured: the
    run ignored the probe's SIGINT and finished, exit 0), as a user's `nohup fedsim run ... &` rightly would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cfg: Path, ray_tmp: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", "run", str(cfg), "--quiet"],
                            env=cli_env(TMPDIR=str(ray_tmp)), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_interruptible)


def _wait_for(ready, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the run ended before the signal: {proc.communicate()}"
        assert time.monotonic() < deadline, "the moment to signal never came"
        time.sleep(0.02)


def _terminated(proc: subprocess.Popen, ready, wait_s: float, timeout_s: float) -> str:
    """SIGTERM to ``proc`` once ``ready()``; its stderr once it has ended (killed, with its group, should it not)."""
    try:
        _wait_for(ready, proc, wait_s)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return err


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143),
                                          pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)])
def test_a_signal_while_ray_starts_gives_one_line_and_leaves_nothing(tmp_path, ray_tmp, signum, code):
    """Signalled as soon as Ray's session folder appears (its GCS and raylet starting): before, SIGTERM gave Ray's
    C++ stack dump and exit 1 or 15, and Ray's agents outlived the run."""
    cfg = write_yaml(tmp_path / "run.yaml", synthetic_tree(tmp_path, "sig", engine__backend="ray", train__rounds=1))
    proc = _start(cfg, ray_tmp)
    try:
        _wait_for(lambda: bool(_sessions(ray_tmp)), proc)
        time.sleep(0.3)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = err.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("fedsim: interrupted"), err[-3000:]
    assert "nothing was written" in lines[0] and not (tmp_path / "sig").exists()
    assert _survivors(ray_tmp) == [] and _sessions(ray_tmp) == []


_EXIT_BESIDE = """
import atexit, sys, threading
import fedsim.cli.main as cli, fedsim.engine.ray_start as ray_start
atexit.register(print, "finalized")
cli.main = lambda: 143
if sys.argv[1] == "stuck":  # a stand-in for a given-up start's thread still inside Ray's C++ client
    thread = threading.Thread(target=threading.Event().wait, daemon=True)
    thread.start()
    ray_start._STUCK.append(thread)
cli.run_cli()
"""


@pytest.mark.parametrize("start, finalized", [("stuck", False), ("none", True)])
def test_a_process_beside_a_stuck_ray_start_exits_without_finalizing(start, finalized):
    """``run_cli``: finalizing beside a thread inside Ray's C++ client can crash the process, so with such a thread
    it exits with main()'s code and no finalization (no atexit handler runs); without one it finalizes as usual."""
    proc = subprocess.run([sys.executable, "-c", _EXIT_BESIDE, start], env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 143 and ("finalized" in proc.stdout) == finalized, proc.stderr


@pytest.mark.slow  # a run to its first round, through Ray: ~30-100 s here
def test_a_signal_mid_run_leaves_no_process_and_names_the_resume(tmp_path, ray_tmp):
    cfg = write_yaml(tmp_path / "run.yaml", synthetic_tree(tmp_path, "mid", train__rounds=50))
    proc = _start(cfg, ray_tmp)
    rows = tmp_path / "mid" / "rounds.jsonl"
    err = _terminated(proc, lambda: rows.exists() and rows.stat().st_size > 0, 120, 90)
    lines = err.strip().splitlines()
    assert proc.returncode == 143 and len(lines) == 1, err[-3000:]
    assert lines[0] == f"fedsim: interrupted; continue with `fedsim run --resume {tmp_path / 'mid'}`"
    assert _survivors(ray_tmp) == [] and _sessions(ray_tmp) == []


@pytest.mark.slow  # a whole run through Ray: ~30-100 s here
def test_a_finished_local_run_removes_its_ray_session_folder_only(tmp_path, ray_tmp):
    """Before, every run left its session folder (~0.5 MB; 231 had gathered in /tmp/ray here). Another Ray's
    folder in the same place is kept."""
    other = ray_tmp / "ray" / "session_2026-01-01_00-00-00_000000_1"
    other.mkdir(parents=True)
    cfg = write_yaml(tmp_path / "run.yaml", synthetic_tree(tmp_path, "done", train__rounds=1))
    done = fedsim_cli("run", str(cfg), "--quiet", env=cli_env(TMPDIR=str(ray_tmp)), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _sessions(ray_tmp) == [other.name] and _survivors(ray_tmp) == []


@pytest.mark.parametrize("write", ["checkpoint", "atomic"])
def test_a_full_disk_is_named_with_what_the_write_needed(tmp_path, monkeypatch, write):
    """Every write lands on /dev/full (ENOSPC; numpy's fwrite then says only "N requested and M written")."""
    import builtins

    import numpy as np

    from fedsim import atomic
    from fedsim.core import checkpoint
    from fedsim.errors import DiskFull

    def full(file, mode="r", *args, **kwargs):
        return builtins.open("/dev/full", mode, *args, **kwargs) if "w" in mode else builtins.open(file, mode, *args, **kwargs)

    vector = np.zeros(100_000, np.float32)
    if write == "checkpoint":
        monkeypatch.setattr(checkpoint, "open", full, raising=False)
        target = tmp_path / "global.npy"
        call = lambda: checkpoint.commit(tmp_path, 1, vector, {})  # noqa: E731
    else:
        monkeypatch.setattr(atomic, "open", full, raising=False)
        target = tmp_path / "model.npz"
        call = lambda: atomic.write_bytes(target, vector.tobytes())  # noqa: E731
    with pytest.raises(DiskFull) as caught:
        call()
    message = str(caught.value)
    assert message.startswith(f"the disk holding {target} is full: writing it needed 400,000 bytes"), message
    assert "requested" not in message and "\n" not in message


def test_report_refuses_an_endless_line_reading_a_bounded_part(tmp_path):
    """metrics.jsonl is one 300 MB line of NUL bytes (a sparse file): before, `fedsim report` read it whole (732 MB
    of memory) and called it "missing or empty"."""
    from conftest import make_run

    from fedsim.core.results import MAX_ROW_BYTES

    run_dir = make_run(tmp_path, "nul", "fedavg", [[0.5, 0.5]])
    with open(run_dir / "metrics.jsonl", "wb") as f:
        f.truncate(300 * 2**20)
    done = fedsim_cli("report", str(run_dir), "--out", str(tmp_path / "report"), timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert f"{run_dir / 'metrics.jsonl'}:1: a line longer than {MAX_ROW_BYTES:,} bytes" in lines[0]


@pytest.mark.slow  # a sweep's trials to their first round, through Ray Tune: ~60-150 s here
@pytest.mark.parametrize("command", ["sweep"])
def test_sigterm_mid_sweep_is_143_with_the_resume_line(tmp_path, ray_tmp, command):
    tree = synthetic_tree(tmp_path, "sig", train__rounds=50, sweep={"algorithm": ["fedavg", "fedper"]})
    cfg = write_yaml(tmp_path / "sweep.yaml", tree)
    proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", command, str(cfg), "--quiet"],
                            env=cli_env(TMPDIR=str(ray_tmp)), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_interruptible)
    err = _terminated(proc, lambda: any(p.stat().st_size > 0 for p in tmp_path.glob("sig*/rounds.jsonl")), 300, 120)
    lines = err.strip().splitlines()
    assert proc.returncode == 143 and len(lines) == 1, err[-3000:]
    assert lines[0] == f"fedsim: interrupted; continue with `fedsim {command} {cfg}`", lines
    assert _survivors(ray_tmp) == []
