"""A run's result rows (``metrics.jsonl``, ``rounds.jsonl``, ``comm.jsonl``) read back strictly: by resume, which
rewrites them, and by ``fedsim report``. Torch- and Ray-free."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeGuard

from fedsim.errors import ResultsDamaged


def read_results(path: Path) -> list[dict[str, Any]]:
    """A run's own result rows (metrics.jsonl, rounds.jsonl, comm.jsonl), for a resume that rewrites the file:
    only a torn *last* line (a crash mid-write: no newline after it) is dropped; any other line that is not a row
    with a round is a one-line error naming file and line, so no row is lost without account."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    torn = lines.pop()  # what follows the last newline: nothing, or a line a crash cut short (its round is redone)
    rows = [_result_row(path, number, line) for number, line in enumerate(lines, start=1)]
    try:
        last = json.loads(torn) if torn.strip() else None
    except json.JSONDecodeError:
        last = None
    return rows + ([last] if _is_row(last) else [])


def _is_row(row: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(row, dict) and type(row.get("round")) is int and row["round"] >= 1


def _result_row(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        row = None
    if not _is_row(row):
        raise ResultsDamaged(f"{path}:{number}: not a result row ({line[:60]!r}); resume rewrites this file and would "
                             "lose the rows after it: restore the file from a backup, or start a new run")
    return row
