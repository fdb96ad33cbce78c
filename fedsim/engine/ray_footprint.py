"""What a Ray started by this process leaves on the machine: its processes (GCS, raylet, agents, workers) and its
``session_*`` folder. Both are ended and removed when the process shuts its Ray down, or abandons its start.

Measured (Ray 2.60): ``ray.shutdown()`` leaves the session folder (every run added one, ~0.5 MB, to
``/tmp/ray``), and a start that is cut short, or a driver killed by a signal, leaves the dashboard and runtime-env
agents and idle workers running, parented to init. Only what this process started is touched: processes that
descend from it (taken while the raylet is still their parent) and the session folder named after its own pid."""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import ray

GRACE_S = 5.0  # what a Ray process gets to exit on SIGTERM before SIGKILL (Ray's own shutdown allows it as long)
RAY_PACKAGE = str(Path(ray.__file__).parent)


def ray_temp_root() -> Path:
    """The folder holding the ``session_*`` folders of local Rays (RAY_TMPDIR, else TMPDIR on Linux, else /tmp,
    with ``ray`` appended: Ray's own rule)."""
    from ray._common.utils import get_default_ray_temp_dir

    return Path(get_default_ray_temp_dir())


def _is_ray(proc: psutil.Process) -> bool:
    """A process Ray runs: its title (``ray::IDLE``, ``ray::DashboardAgent``) or a program from Ray's package."""
    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return bool(cmdline) and (cmdline[0].startswith("ray::") or any(RAY_PACKAGE in part for part in cmdline[:3]))


def ray_descendants() -> list[psutil.Process]:
    """Ray's processes among this process's descendants (Ray's GCS and raylet are its children, the agents and
    workers the raylet's)."""
    try:
        return [p for p in psutil.Process().children(recursive=True) if _is_ray(p)]
    except psutil.Error:
        return []


def end_processes(procs: list[psutil.Process]) -> None:
    """SIGTERM each process still alive, SIGKILL those that have not exited after GRACE_S. psutil checks each
    process's start time, so a pid reused since is never signalled."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=GRACE_S)


@dataclass
class Footprint:
    """What a local Ray start leaves: ``before`` are the Ray processes that descended from this process before it
    began (kept running); its own session folders are those named after this pid that were not there before."""

    root: Path = field(default_factory=ray_temp_root)
    before: set[int] = field(default_factory=lambda: {p.pid for p in ray_descendants()})
    sessions_before: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.sessions_before = set(self._own_sessions())

    def _own_sessions(self) -> list[str]:
        # Ray names a session folder session_<date>_<time>_<microseconds>_<pid of the process that started it>.
        suffix = f"_{os.getpid()}"
        try:
            return [p.name for p in self.root.iterdir() if p.name.startswith("session_") and p.name.endswith(suffix)]
        except OSError:
            return []

    def remove(self, shutdown: Callable[[], None] = lambda: None) -> None:
        """``shutdown()`` (Ray's own), then end the Ray processes started since and remove the session folder(s)
        this process created since (with Ray's ``session_latest`` link when it points at one of them). The
        processes are taken first: once the raylet has exited, its agents and workers no longer descend from here."""
        started = [p for p in ray_descendants() if p.pid not in self.before]
        shutdown()
        end_processes(started)
        created = [name for name in self._own_sessions() if name not in self.sessions_before]
        latest = self.root / "session_latest"
        if latest.is_symlink() and Path(os.readlink(latest)).name in created:
            latest.unlink(missing_ok=True)
        for name in created:
            shutil.rmtree(self.root / name, ignore_errors=True)
