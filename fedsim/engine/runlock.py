"""One live run per run folder: an OS file lock held for the run's whole life.

The lock is ``flock`` on ``RUN/.lock``: the kernel drops it when the holding process exits, however
it exits (SIGKILL included), so a crashed run never leaves a stale lock to clean up, and the file
itself is never deleted (deleting it would let two processes lock two different files).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from fedsim.core.runfiles import LOCK
from fedsim.errors import ConfigError


def _refuse(run_dir: Path) -> None:
    try:
        holder = (run_dir / LOCK).read_text().strip() or "another process"
    except OSError:
        holder = "another process"
    raise ConfigError(f"name: run folder {run_dir} is in use by a live run ({holder}); wait for it to finish, "
                      "or choose another name (nothing was changed)")


def refuse_if_live(run_dir: Path) -> None:
    """Fail fast, before Ray starts, when another process holds the folder (the real guard is :func:`hold`)."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return  # no lock file: no run has ever held this folder
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        _refuse(run_dir)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Create the run folder if needed and hold its lock until the block ends; refuse if it is held."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _refuse(run_dir)
        with contextlib.suppress(OSError):  # who holds it is for the refusal message only (a full disk fails it)
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock
