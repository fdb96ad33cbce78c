"""The invocations that ran a run -- its parts: the first and each resume -- and their wall time, in the run folder's
``parts.json``. Rewritten at every checkpoint and when an invocation ends (finished, failed or interrupted), so
summary.json's ``wall_seconds`` is the whole run's, a resumed run keeps the time of the parts before it, and a part
killed outright still counts up to its last checkpoint."""
from __future__ import annotations

import json
import time
from pathlib import Path

from fedsim import atomic, safe_files
from fedsim.core import runfiles
from fedsim.engine.driver import Run


class Parts:
    """The parts of the run in ``folder``: those before this invocation (read once) and this one, which began at
    ``started_at`` and continues after round ``done``."""

    def __init__(self, folder: Path, started_at: str, done: int) -> None:
        self.path = folder / runfiles.PARTS
        earlier = json.loads(safe_files.read_text(self.path)) if self.path.exists() else []
        self.earlier: list[dict] = [p for p in earlier if p["started_at"] != started_at]
        self.current = {"started_at": started_at, "from_round": done + 1, "to_round": done, "seconds": 0.0}

    def reached(self, round_idx: int) -> None:
        """This part has logged ``round_idx`` (a later round, or after a rollback the round it went back to)."""
        self.current["to_round"] = round_idx

    def record(self, run: Run) -> None:
        """This part's time so far, into parts.json beside the earlier parts'."""
        self.current["seconds"] = time.perf_counter() - run.started
        atomic.write_text(self.path, json.dumps([*self.earlier, self.current], indent=1))

    def summary(self) -> dict:
        """summary.json's wall time: ``wall_seconds``, every part's together, and ``parts``, each part's own."""
        parts = [*self.earlier, self.current]
        return {"wall_seconds": sum(p["seconds"] for p in parts), "parts": parts}
