"""Finished runs kept beside the report, so that a suite that takes many hours spans machines and sessions.

A run folder is scratch (checkpoints, partition, logs); what the report and the runner read of a finished run is
small: its config, summary, per-round and per-client rows, and, for a run another run starts from, its final
model. ``keep`` writes those into ``<archive>/<run name>.tar.gz`` once the run has finished; ``restore`` puts them
back into a runs folder that lacks the run, so the runner sees it finished (or, if its settings changed since,
changed) and the report reads it as if it had run here. A tar keeps each file's time, which is how the runner tells
that a needed run ran again after its dependant started from it.

An archive is input: it is read only when its members are exactly regular files of the kept names, and it is
extracted beside the runs folder first and moved into place whole, so a bad or half-copied archive never leaves a
half-restored run folder. It is also bounded (``MAX_MEMBERS``, ``MAX_BYTES``, ``MAX_RATIO``): each member is
checked as its header is read, before its data is unpacked, and the gunzipped stream itself stops at the bound, so a
compression bomb or an archive of a million members is refused after reading at most the bound, never unpacked or
listed whole."""
from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedsim import atomic, safe_files
from fedsim.core import runfiles
from fedsim.errors import ConfigError

KEPT = (runfiles.CONFIG, runfiles.SUMMARY, runfiles.ROUNDS, runfiles.METRICS)
MODEL = runfiles.MODEL  # kept only for a run another run starts from (model.init_from)
SUFFIX = ".tar.gz"

# Bounds on what an archive may unpack to, far above what a kept run holds (measured on the 280 archives of
# reproduction/runs: at most 5 members, 0.6 MB unpacked, 5.7 times their packed size) and room for the final model
# of a large network (model.npz, which hardly compresses). The member count follows from the names: each kept name once.
MAX_MEMBERS = len(KEPT) + 1
MAX_BYTES = 1 << 30  # 1 GiB unpacked in all
MAX_RATIO = 100  # unpacked bytes per packed byte
MAX_MTIME = 2**33  # a file time in seconds (the year 2242): one past it is no time a run wrote
# What the tar stream holds besides the members' data: a 512-byte header and padding per member, and the end records.
_TAR_OVERHEAD = MAX_MEMBERS * 2 * tarfile.BLOCKSIZE + 2 * tarfile.RECORDSIZE


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
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=archive)  # no name to plant a link at
    tmp = Path(name)
    try:
        os.fchmod(fd, atomic.FILE_MODE)
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
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
    # A fresh folder of an unguessable name: a link planted at a predictable one would send the extraction outside.
    runs_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".restoring", dir=runs_dir))
    os.chmod(staging, 0o755)  # mkdtemp's 0o700 would become the run folder's
    try:
        with _opened(source) as tar:  # each member checked again as it is extracted: the archive may have changed
            tar.extractall(staging, members=_checked(tar, source), filter="data")  # keeps each file's time
        try:
            os.replace(staging, folder)
        except OSError:  # another process created the run folder meanwhile: its folder stands
            return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _members(source: Path) -> set[str]:
    """The archive's file names, checked (:func:`_checked`), with every kept file but the model there."""
    with _opened(source) as tar:
        names = [member.name for member in _checked(tar, source)]
    lacking = [name for name in KEPT if name not in names]
    if lacking:
        raise ConfigError(f"{source}: lacks {lacking[0]}, so it is not a finished run; {_fix(source)}")
    return set(names)


def _fix(source: Path) -> str:
    return f"remove {source} to run that run again"


class _Bomb(Exception):
    """The gunzipped stream went past what the archive may unpack to."""


class _BoundedStream:
    """The archive's gunzipped tar stream, which refuses (``_Bomb``) to be read or skipped past ``limit`` bytes:
    tarfile skips a member's data by seeking, which gunzips it, and reads long-name headers whole."""

    def __init__(self, source: Path, limit: int):
        self._file = safe_files.open_regular(source)  # a FIFO would block the read forever
        self._gz = gzip.GzipFile(fileobj=self._file, mode="rb")
        self.limit = limit

    def _check(self, end: int) -> None:
        if end > self.limit:
            raise _Bomb

    def read(self, size: int = -1) -> bytes:
        self._check(self.limit + 1 if size < 0 else self._gz.tell() + size)
        return self._gz.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check(offset if whence == os.SEEK_SET else self.limit + 1)
        return self._gz.seek(offset)

    def tell(self) -> int:
        return self._gz.tell()

    def close(self) -> None:
        self._gz.close()
        self._file.close()


def _limit(source: Path) -> int:
    """The most the archive's members may unpack to: ``MAX_BYTES``, and ``MAX_RATIO`` times its packed size."""
    return min(MAX_BYTES, MAX_RATIO * source.stat().st_size)


@contextmanager
def _opened(source: Path) -> Iterator[tarfile.TarFile]:
    """``tarfile`` over the bounded stream; a bomb, a damaged or a truncated archive is one ConfigError (an error
    writing elsewhere, a full disk while extracting, is not the archive's and passes through)."""
    unreadable = f"{source}: not a readable run archive ({{}}); {_fix(source)}"
    try:
        stream = _BoundedStream(source, _limit(source) + _TAR_OVERHEAD)
    except OSError as err:
        raise ConfigError(unreadable.format(err)) from None
    try:
        with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
            yield tar
    except _Bomb:
        raise ConfigError(_too_big(source)) from None
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ConfigError(unreadable.format(err)) from None
    finally:
        stream.close()


def _too_big(source: Path) -> str:
    return (f"{source}: unpacks to more than {_limit(source):,} bytes (the bound: {MAX_BYTES:,} bytes, and "
            f"{MAX_RATIO} times the archive's size), not a kept run; {_fix(source)}")


def _checked(tar: tarfile.TarFile, source: Path) -> Iterator[tarfile.TarInfo]:
    """The archive's members one header at a time, each checked before its data is read: a regular file of a kept
    name, no name twice (so at most ``MAX_MEMBERS``: a million members are refused at the sixth header), their
    sizes together within the bound."""
    seen: set[str] = set()
    total = 0
    for member in tar:
        if member.name in seen or not member.isfile() or member.name not in KEPT + (MODEL,):
            raise ConfigError(f"{source}: holds {'a file twice' if member.name in seen else repr(member.name)}, not "
                              f"only the files of a finished run ({', '.join(KEPT + (MODEL,))}); {_fix(source)}")
        if not (isinstance(member.mtime, (int, float)) and 0 <= member.mtime <= MAX_MTIME):  # NaN fails too
            raise ConfigError(f"{source}: {member.name} has the time {member.mtime!r}, not one a run wrote; "
                              f"{_fix(source)}")
        total += member.size
        if total > _limit(source):
            raise ConfigError(_too_big(source))
        seen.add(member.name)
        yield member
