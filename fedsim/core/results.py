"""A run's result rows (``metrics.jsonl``, ``rounds.jsonl``, ``comm.jsonl``) read back strictly: by resume, which
rewrites them, and by ``fedsim report``. Torch- and Ray-free."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeGuard

from fedsim import safe_files
from fedsim.errors import ResultsDamaged


MAX_ROW_BYTES = 1 << 20
"""The longest line a result file may hold: a row is at most a few KB (a client's record with its logged values, a
round's statistics), so a longer line is damage, refused having read at most this much of it (a 300 MB line of NUL
bytes was read whole before)."""


def read_results(path: Path) -> list[dict[str, Any]]:
    """A run's own result rows (metrics.jsonl, rounds.jsonl, comm.jsonl), for a resume that rewrites the file:
    only a torn *last* line (a crash mid-write: no newline after it) is dropped; any other line that is not a row
    with a round, and any line over MAX_ROW_BYTES, is a one-line error naming file and line, so no row is lost
    without account. Read one line at a time, each at most MAX_ROW_BYTES."""
    if not path.exists():
        return []
    rows = []
    with safe_files.open_regular(path) as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_ROW_BYTES + 1), b""), start=1):
            if len(line) > MAX_ROW_BYTES:
                raise ResultsDamaged(f"{path}:{number}: a line longer than {MAX_ROW_BYTES:,} bytes, the most a result "
                                     "row takes; the file is damaged: restore it from a backup, or start a new run")
            if line.endswith(b"\n"):
                rows.append(_result_row(path, number, line[:-1]))
            else:  # the last line, a crash cut short: its round is redone
                last = _parsed(line)
                rows += [last] if _is_row(last) else []
    return rows


def _parsed(line: bytes) -> object:
    try:
        return json.loads(line) if line.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _is_row(row: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(row, dict) and type(row.get("round")) is int and row["round"] >= 1


def _result_row(path: Path, number: int, line: bytes) -> dict[str, Any]:
    row = _parsed(line)
    if not _is_row(row):
        shown = line[:60].decode("utf-8", "backslashreplace")
        raise ResultsDamaged(f"{path}:{number}: not a result row ({shown!r}); resume rewrites this file and would "
                             "lose the rows after it: restore the file from a backup, or start a new run")
    return row
