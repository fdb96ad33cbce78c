"""Kept runs put back into a runs folder before anything reads it, so a suite or a leaderboard continues on another
machine, a fresh clone, or a checkout whose runs folder holds an earlier plan's folders under the same names."""
from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim.reproduce import archive
from fedsim.sweep.runs import claimed, status

if TYPE_CHECKING:
    from fedsim.reproduce.runner import PlannedRun


SET_ASIDE = ".set-aside"  # under the runs folder: folders of other settings a kept run replaced, never deleted


def restore_kept(planned: list[PlannedRun], kept: Path) -> int:
    """Every planned run the archive ``kept`` holds and the runs folder lacks, put back (``archive.restore``);
    returns how many. Done before anything reads the runs folder, so a suite continues on another machine. A folder
    of the run's name made with other settings (``changed``: running it would overwrite it) gives way where the
    archive holds the run finished at the planned ones: it is moved to ``.set-aside/`` under the runs folder, so the
    kept result is read instead of trained again, and nothing is deleted."""
    return sum(_restore(item, kept) for item in planned)


def _restore(item: PlannedRun, kept: Path) -> bool:
    runs_dir, name = Path(item.config.out_dir), item.config.name
    if not archive.path_of(kept, name).exists():
        return False
    if not item.folder.exists():
        return archive.restore(kept, runs_dir, name)
    if status(item.config) != "changed" or not _kept_as_planned(item, kept):
        return False
    with claimed(item.config) as mine:
        if not mine:  # a process is running it (under its other settings): its folder stands
            return False
        aside = runs_dir / SET_ASIDE / f"{name}-{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.replace(item.folder, aside)
        return archive.restore(kept, runs_dir, name)


def _kept_as_planned(item: PlannedRun, kept: Path) -> bool:
    """Whether ``kept`` holds ``item`` finished at its planned settings: put back into a scratch folder and read
    as the run reads its own folder."""
    with tempfile.TemporaryDirectory(prefix=".kept-check-", dir=item.config.out_dir) as scratch:
        if not archive.restore(kept, Path(scratch), item.config.name):
            return False
        return status(item.config.model_copy(update={"out_dir": scratch})) == "finished"
