"""The one way fedsim opens a file it reads back (a run folder's results, a checkpoint, a sweep's ledger, a kept
archive) and checks a folder it writes into. A run folder is input: anything in it may have been put there by
someone else. A FIFO in place of ``metrics.jsonl`` would block a read forever and a device never end, a symbolic
link would send a read or a write to a file outside the folder. So a file is opened without blocking and without
following a link, checked on the open descriptor (nothing swapped in between a check and the read is read), and
refused in one line naming it; a folder fedsim writes into is refused when it is a link."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from fedsim.errors import ConfigError


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: Path | str, follow_links: bool = False) -> BinaryIO:
    """``path`` opened for reading in binary, refused (ConfigError, one line) unless it is a regular file.
    ``follow_links``: a file the user names (a config given on the command line) may be a link; one fedsim wrote
    itself never is. A missing file raises FileNotFoundError as ``open`` does."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            raise ConfigError(f"{path}: a symbolic link where fedsim keeps a file of its own; remove the link "
                              "(fedsim never reads or writes through links here)") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigError(f"{path}: {_kind(mode)} where fedsim expects a regular file; remove it or put back the "
                          "file fedsim wrote")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: Path | str, follow_links: bool = False) -> bytes:
    with open_regular(path, follow_links) as f:
        return f.read()


def read_text(path: Path | str, follow_links: bool = False) -> str:
    return read_bytes(path, follow_links).decode()


def refuse_linked_folder(path: Path, base: Path, key: str | None = None) -> None:
    """Refuse ``path`` (a folder fedsim is about to write into, under ``base``, the folder the user named) when it or
    a folder between ``base`` and it is a symbolic link or not a folder: its files would land outside ``base``."""
    current = base
    for part in path.relative_to(base).parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return  # fedsim makes the rest
        where = f"{key}: {current}" if key else str(current)
        if stat.S_ISLNK(mode):
            raise ConfigError(f"{where}: a symbolic link where fedsim writes a folder of its own; remove the link "
                              "(fedsim never writes through links; nothing was written)")
        if not stat.S_ISDIR(mode):
            raise ConfigError(f"{where}: {_kind(mode)} where fedsim writes a folder; remove it or write elsewhere")


def make_folder(path: Path, base: Path, key: str | None = None) -> Path:
    """``path`` made (with its parents) after :func:`refuse_linked_folder`, and checked again once made (a link
    planted between the check and the mkdir)."""
    refuse_linked_folder(path, base, key)
    path.mkdir(parents=True, exist_ok=True)
    refuse_linked_folder(path, base, key)
    return path
