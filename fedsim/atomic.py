"""Whole-file replacement that a crash can never leave half-written; a write that runs out of disk space said as
such (``space_named``)."""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fedsim.errors import DiskFull

# What numpy raises when fwrite writes less than asked (a full disk, with no errno): "%ld requested and %ld written".
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def _current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(mask)
    return mask


# mkstemp makes its file 0600; a replaced file gets the mode open() would have given it (0666 less the umask).
FILE_MODE = 0o666 & ~_current_umask()


def is_disk_full(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT) or bool(_SHORT_WRITE.fullmatch(str(err)))


@contextlib.contextmanager
def space_named(path: Path, needed: int) -> Iterator[None]:
    """Writing ``needed`` bytes to ``path``: a full disk becomes DiskFull, naming the path and the free space."""
    try:
        yield
    except DiskFull:
        raise
    except OSError as err:
        if not is_disk_full(err):
            raise
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = 0
        raise DiskFull(path, needed, free) from None


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``: a reader
    (``fedsim report``, a resume) sees the old content or the new, never a truncated file. The temporary file is
    made fresh (``mkstemp``: a name nobody can plant a link at), and the rename replaces a link at ``path`` rather
    than writing through it."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """``write_text`` for bytes (an ``.npz`` built in memory, say)."""
    path = Path(path)
    with space_named(path, len(data)):
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, FILE_MODE)
        with space_named(path, len(data)), open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
