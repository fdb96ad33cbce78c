"""Whole-file replacement that a crash can never leave half-written."""
from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``: a reader
    (``fedsim report``, a resume) sees the old content or the new, never a truncated file. The
    temporary name carries the pid, so two processes never write into the same one."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    """``write_text`` for bytes (an ``.npz`` built in memory, say)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
