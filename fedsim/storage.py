"""Where a run folder lives: a local folder (or a mount every node shares) or an object store URI
(``s3://bucket/prefix``, ``gs://bucket/prefix``, ``hdfs://...``).

The filesystem layer is ``pyarrow.fs``: one self-contained wheel with S3, GCS and HDFS built in (no
botocore/aiobotocore version pins to reconcile, as fsspec's s3fs needs), and the layer Ray itself uses for
its storage paths. Credentials come from the usual places (``AWS_*`` variables or the instance's role,
``GOOGLE_APPLICATION_CREDENTIALS``); ``AWS_ENDPOINT_URL`` points S3 at any S3-compatible server.

Each process works in a local folder and moves whole files: an object is written by one request, so a
reader sees all of it or none of it. Object stores have no rename; checkpoints are published by writing
their files first and the ``latest`` pointer last (see ``checkpoint.publish``).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs

from fedsim import atomic, safe_files
from fedsim.errors import StorageError


USER_DIR_ENV = "FEDSIM_USER_DIR"  # the directory the user ran fedsim from, as every process of a run sees it


def user_dir() -> Path:
    """The directory the user ran fedsim from: a config's relative paths are relative to it. A Ray Tune trial runs
    in a working directory of its own and a worker in wherever its node started, so the driver hands its own
    directory to every Ray process of the run (``FEDSIM_USER_DIR``); the driver itself reads its cwd."""
    return Path(os.environ.get(USER_DIR_ENV) or os.getcwd())


def user_path(path: str | Path) -> Path:
    """A path a config or the user names (``~`` expanded), relative paths taken from :func:`user_dir`."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else user_dir() / path


def portable(path: str | Path) -> Path:
    """``path`` as a record names it on every machine: relative to :func:`user_dir` where it lies under it (a
    repository's ``runs/``, whichever folder the clone is in), else absolute. What a config stores this way reads
    back the same through :func:`user_path` in every process of a run."""
    path, root = user_path(path).resolve(), user_dir().resolve()
    return path.relative_to(root) if path.is_relative_to(root) else path


def anchored(location: str) -> str:
    """``location`` as every process reads it alike: a folder made absolute (:func:`user_path`), a URI as it is."""
    return location if is_uri(location) else str(user_path(location))


def is_uri(location: str | Path) -> bool:
    """Whether ``location`` names an object store rather than a folder of this machine."""
    return "://" in str(location) and not str(location).startswith("file://")


def join(location: str | Path, *parts: str) -> str:
    """``location``/part/...: for URIs by string (a URI is not a local path), else as a path."""
    if is_uri(location):
        return "/".join([str(location).rstrip("/"), *parts])
    return str(Path(location, *parts))


def parent_and_name(location: str) -> tuple[str, str]:
    """``s3://b/runs/quick`` -> (``s3://b/runs``, ``quick``); a local path likewise."""
    if is_uri(location):
        parent, _, name = location.rstrip("/").rpartition("/")
        return parent, name
    path = Path(location)
    return str(path.parent), path.name


ANSWER_TIMEOUT_S = 30  # a store that says nothing for this long is unreachable (gs:// without network hangs)


def _opened(location: str) -> tuple[pafs.FileSystem, str]:
    """The store's filesystem and root, after one request (the first that can hang)."""
    try:
        fs, root = pafs.FileSystem.from_uri(location)
        fs.get_file_info(root)
    except (OSError, ValueError) as err:
        raise StorageError(f"out_dir: cannot open {location} ({str(err).splitlines()[0] if str(err) else err}); "
                           "check the URI and credentials") from None
    return fs, root


def _answering(request, location: str):
    """``request()``, or a one-line StorageError when the store does not answer within ANSWER_TIMEOUT_S. The call
    runs on a daemon thread, so a request that never returns cannot keep the process from exiting."""
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["value"] = request()
        except BaseException as err:  # handed to the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(ANSWER_TIMEOUT_S)
    if worker.is_alive():
        raise StorageError(f"out_dir: {location} did not answer within {ANSWER_TIMEOUT_S} s; check the network, the "
                           "endpoint (AWS_ENDPOINT_URL) and credentials")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class Store:
    """The files under one location, by path relative to it."""

    def __init__(self, location: str | Path):
        self.location = str(location)
        self.is_uri = is_uri(location)
        if self.is_uri:
            self.fs, self.root = _answering(lambda: _opened(self.location), self.location)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), str(user_path(location).resolve())

    def _path(self, rel: str = "") -> str:
        return str(PurePosixPath(self.root, rel)) if rel else self.root

    def exists(self, rel: str = "") -> bool:
        return self.fs.get_file_info(self._path(rel)).type != pafs.FileType.NotFound

    def files(self, rel: str = "") -> list[str]:
        """Every file under ``rel``, as paths relative to this location."""
        selector = pafs.FileSelector(self._path(rel), recursive=True, allow_not_found=True)
        base = PurePosixPath(self.root)
        return sorted(str(PurePosixPath(info.path).relative_to(base)) for info in self.fs.get_file_info(selector)
                      if info.type == pafs.FileType.File)

    def read_bytes(self, rel: str) -> bytes:
        """A local file read by Python, refused unless regular (a FIFO would block inside pyarrow, deaf to SIGTERM)."""
        if not self.is_uri:
            return safe_files.read_bytes(self._path(rel))
        with self.fs.open_input_stream(self._path(rel)) as stream:
            return stream.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        """A local file replaced atomically (pyarrow's output stream truncates through a link); an object whole."""
        if not self.is_uri:
            target = Path(self._path(rel))
            safe_files.make_folder(target.parent, Path(self.root))
            atomic.write_bytes(target, data)
            return
        self.fs.create_dir(str(PurePosixPath(self._path(rel)).parent), recursive=True)
        with self.fs.open_output_stream(self._path(rel)) as stream:
            stream.write(data)

    def upload(self, local: Path, rel: str) -> None:
        self.fs.create_dir(str(PurePosixPath(self._path(rel)).parent), recursive=True)
        pafs.copy_files(str(local), self._path(rel), destination_filesystem=self.fs)

    def download_tree(self, local_dir: Path, rel: str = "", skip: str | None = None) -> None:
        """Every file under ``rel`` into ``local_dir``, except those in its top-level folder ``skip``."""
        for name in self.files(rel):
            if skip and PurePosixPath(name).relative_to(rel or ".").parts[0] == skip:
                continue
            target = local_dir / PurePosixPath(name).relative_to(rel or ".")
            target.parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(self._path(name), str(target), source_filesystem=self.fs)

    def delete(self, rel: str) -> None:
        """A file or a whole folder; nothing when it is absent."""
        info = self.fs.get_file_info(self._path(rel))
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(info.path)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(info.path)


@contextmanager
def local_output(target: str) -> Iterator[Path]:
    """A local file to write ``target``'s content into. A URI target is uploaded whole once the block ends
    without error; a local target is written in place (the caller makes it durable)."""
    if not is_uri(target):
        yield Path(target)
        return
    parent, name = parent_and_name(target)
    with tempfile.TemporaryDirectory(prefix="fedsim-out-") as tmp:
        local = Path(tmp) / name
        yield local
        Store(parent).upload(local, name)


@contextmanager
def local_folder(location: str, skip: str | None = None) -> Iterator[Path]:
    """``location``'s files as a local folder: the folder itself, or a temporary download of a URI (without
    its top-level folder ``skip``). The copy keeps the location's name, which reports show."""
    if not is_uri(location):
        yield Path(location)
        return
    with tempfile.TemporaryDirectory(prefix="fedsim-in-") as tmp:
        local = Path(tmp, parent_and_name(location)[1])
        Store(location).download_tree(local, skip=skip)
        yield local


def staging_folder(location: str) -> Path:
    """A fresh local working copy for a run stored at ``location`` (a URI): what the run writes goes
    here first and is uploaded from here."""
    return Path(tempfile.mkdtemp(prefix=f"fedsim-{parent_and_name(location)[1]}-"))


def remove_staging(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
