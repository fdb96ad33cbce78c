"""Finished runs kept beside the report, so that a suite that takes many hours spans machines and sessions.

A run folder is scratch (checkpoints, partition, logs); what the report and the runner read of a finished run is
small: its config, summary, per-round and per-client rows, and, for a run another run starts from, its final
model. ``keep`` writes those into ``<archive>/<run name>.tar.gz`` once the run has finished; ``restore`` puts them
back into a runs folder that lacks the run, so the runner sees it finished (or, if its settings changed since,
changed) and the report reads it as if it had run here. A tar keeps each file's time, which is how the runner tells
that a needed run ran again after its dependant started from it.

An archive is input: it is read only when its members are exactly regular files of the kept names, and it is
extracted beside the runs folder first and moved into place whole, so a bad or half-copied archive never leaves a
half-restored run folder."""
from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from fedsim.core import runfiles
from fedsim.errors import ConfigError

KEPT = (runfiles.CONFIG, runfiles.SUMMARY, runfiles.ROUNDS, runfiles.METRICS)
MODEL = runfiles.MODEL  # kept only for a run another run starts from (model.init_from)
SUFFIX = ".tar.gz"


def path_of(archive: Path, name: str) -> Path:
    return archive / f"{name}{SUFFIX}"


def keep(folder: Path, archive: Path, with_model: bool = False) -> Path:
    """Archive the finished run in ``folder`` (replacing an older archive of it, never leaving a partial one)."""
    names = KEPT + ((MODEL,) if with_model else ())
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise ConfigError(f"{folder}: cannot archive an unfinished run (no {missing[0]}); bring it to completion first")
    archive.mkdir(parents=True, exist_ok=True)
    target = path_of(archive, folder.name)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name in names:
                tar.add(folder / name, arcname=name, recursive=False)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def is_kept(folder: Path, archive: Path, with_model: bool = False) -> bool:
    """Whether the archive holds this run as it is now: there, no older than the run's summary, and with its
    model where one is needed."""
    target = path_of(archive, folder.name)
    summary = folder / runfiles.SUMMARY
    if not target.exists() or not summary.exists() or target.stat().st_mtime < summary.stat().st_mtime:
        return False
    return not with_model or MODEL in _members(target)


def restore(archive: Path, runs_dir: Path, name: str) -> bool:
    """Put the archived run ``name`` into ``runs_dir`` when the runs folder has no folder of that name (a local
    folder is never replaced: it is newer, or a run in progress). Returns whether it restored one."""
    source, folder = path_of(archive, name), runs_dir / name
    if folder.exists() or not source.exists():
        return False
    _members(source)  # refuses a bad archive before anything is written
    staging = runs_dir / f".{name}.{os.getpid()}.restoring"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with tarfile.open(source, "r:gz") as tar:
            tar.extractall(staging, filter="data")  # keeps each file's time; no links, devices or paths outside
        try:
            os.replace(staging, folder)
        except OSError:  # another process created the run folder meanwhile: its folder stands
            return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _members(source: Path) -> set[str]:
    """The archive's file names, checked: regular files of the kept names, every one but the model there."""
    fix = f"remove {source} to run that run again"
    try:
        with tarfile.open(source, "r:gz") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ConfigError(f"{source}: not a readable run archive ({err}); {fix}") from None
    names = [m.name for m in members]
    bad = [m.name for m in members if not m.isfile() or m.name not in KEPT + (MODEL,)]
    if bad or len(set(names)) != len(names):
        raise ConfigError(f"{source}: holds {bad[0] if bad else 'a file twice'!r}, not only the files of a finished "
                          f"run ({', '.join(KEPT + (MODEL,))}); {fix}")
    lacking = [name for name in KEPT if name not in names]
    if lacking:
        raise ConfigError(f"{source}: lacks {lacking[0]}, so it is not a finished run; {fix}")
    return set(names)
