"""The leaderboard's record of runs whose training diverged (``diverged.json`` beside the kept runs): a result, never
retried, shared by every process completing one leaderboard."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from fedsim import atomic, safe_files
from fedsim.config import resume_fingerprint
from fedsim.errors import ConfigError
from fedsim.reproduce.runner import PlannedRun


class Diverged:
    """The runs whose training diverged (a client's loss not finite, train.on_nonfinite=stop): a result of the
    leaderboard (a search trial that diverges is left out of the choice), recorded in ``diverged.json`` where the
    finished runs are kept (``--kept``), with the settings it diverged under, so a resumed leaderboard, here or on
    another machine, neither retries them (the same seed diverges again) nor drops them from the table.

    The file is read at each question and rewritten under a lock on its folder: several processes may complete one
    leaderboard into one kept folder (each skips the runs another is training), and none may drop another's
    record, nor retry a run another has just recorded."""

    def __init__(self, kept: Path):
        self.path = kept / "diverged.json"

    def of(self, item: PlannedRun) -> str | None:
        """Why this run diverged under its present settings, or None."""
        found = self._read().get(item.config.name)
        return found["error"] if found and found["settings"] == _settings(item) else None

    STATUS = "diverged (recorded; not retried)"

    def status(self, item: PlannedRun, folder_status: str) -> str:
        """A run's status as the leaderboard takes it: one not finished whose divergence is recorded stays so."""
        return self.STATUS if folder_status != "finished" and self.of(item) else folder_status

    def record(self, item: PlannedRun, error: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _holding(self.path.parent):
            runs = self._read()
            runs[item.config.name] = {"error": error, "settings": _settings(item)}
            atomic.write_text(self.path, json.dumps(runs, indent=1))

    def _read(self) -> dict[str, dict[str, str]]:
        try:
            runs = json.loads(safe_files.read_text(self.path)) if self.path.exists() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"{self.path}: unreadable ({err}); restore it from git, or remove it to run the "
                              "diverged runs again") from None
        if not (isinstance(runs, dict) and all(isinstance(r, dict) and isinstance(r.get("error"), str)
                                               and isinstance(r.get("settings"), str) for r in runs.values())):
            raise ConfigError(f"{self.path}: not a record of diverged runs (run name -> error and settings); "
                              "restore it from git, or remove it to run the diverged runs again")
        return runs


@contextlib.contextmanager
def _holding(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the folder itself, so no lock file joins the kept runs; the kernel drops it when
    the process exits, however it exits."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _settings(item: PlannedRun) -> str:
    return resume_fingerprint(item.config.model_dump())
