"""One live run per run folder: an OS file lock held for the run's whole life.

The lock is ``flock`` on ``RUN/.lock``: the kernel drops it when the holding process exits, however
it exits (SIGKILL included), so a crashed run never leaves a stale lock to clean up, and the file
itself is never deleted (deleting it would let two processes lock two different files).

A run folder is input: a lock file that is a symbolic link, a hard link or not a regular file is refused in
one line, never followed, so a planted ``.lock`` cannot make fedsim write into a file outside the folder.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from fedsim.core.runfiles import LOCK
from fedsim.errors import ConfigError


def open_lock_file(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """``path`` opened as a lock file (a descriptor), refusing to follow a symbolic link or to open anything but a
    regular file with one name: the lock's holder is written into it, and that must never reach another file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"{path}: a symbolic link where fedsim keeps its lock file; remove the link (fedsim "
                              "never writes through links; nothing was changed)") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a regular file"
        raise ConfigError(f"{path}: {what} where fedsim keeps its lock file; remove it (nothing was changed)")
    return fd


def _refuse(run_dir: Path) -> None:
    try:
        fd = open_lock_file(run_dir / LOCK, os.O_RDONLY)
        try:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
    except (OSError, ConfigError):
        holder = "another process"
    raise ConfigError(f"name: run folder {run_dir} is in use by a live run ({holder}); wait for it to finish, "
                      "or choose another name (nothing was changed)")


def refuse_if_live(run_dir: Path) -> None:
    """Fail fast, before Ray starts, when another process holds the folder (the real guard is :func:`hold`)."""
    try:
        fd = open_lock_file(run_dir / LOCK, os.O_RDONLY)
    except OSError:
        return  # no lock file (no run has ever held this folder), or one not readable here: hold() decides
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
    fd = open_lock_file(run_dir / LOCK)
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
