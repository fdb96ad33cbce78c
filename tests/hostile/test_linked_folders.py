"""Folders and files fedsim writes into that are symbolic links (issue 66, item 1): a link in place of a folder it
writes would send its files outside the folder the user named; a link in place of a file would have its target
overwritten. Every writer is listed in WRITERS (folders: refused in one line, nothing written at the link's target)
and FILE_WRITERS (files: the link replaced, its target untouched). No Ray is started here."""
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_run, synthetic_tree

from fedsim.errors import ConfigError

# (folder fedsim writes into, relative to the run folder) -> the write, called on the run folder
WRITERS: dict[str, Callable[[Path], object]] = {}


def writer(folder: str):
    def register(call: Callable[[Path], object]) -> Callable[[Path], object]:
        WRITERS[folder] = call
        return call
    return register


@writer("export")
@writer("export/round-0001")
def _export(run_dir: Path) -> object:
    from fedsim.cli.export import export_folder

    return export_folder(run_dir, None, "round-0001")


@writer("checkpoints")
def _checkpoint(run_dir: Path) -> object:
    from fedsim.core import checkpoint

    return checkpoint.staging_dir(run_dir, 1)


@writer("tune")
def _tune_state(sweep_dir: Path) -> object:
    from fedsim.config import validate
    from fedsim.sweep.executor import Sweep, _tune_storage

    cfg = validate(synthetic_tree(sweep_dir, "s"))
    sweep = Sweep("s", [cfg], cfg.search)
    sweep.folder = str(sweep_dir)
    return _tune_storage(sweep)


@pytest.mark.parametrize("folder", list(WRITERS))
def test_a_folder_fedsim_writes_into_that_is_a_link_is_refused_and_nothing_lands_outside(tmp_path, folder):
    run_dir = make_run(tmp_path, "r", "fedavg", [[0.5, 0.6]])
    outside = tmp_path / "outside"
    outside.mkdir()
    link = run_dir / folder
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError) as err:
        WRITERS[folder](run_dir)
    assert "\n" not in str(err.value) and str(link) in str(err.value) and "symbolic link" in str(err.value)
    assert list(outside.iterdir()) == []


def _atomic(path: Path) -> None:
    from fedsim import atomic

    atomic.write_text(path, "new\n")


def _store(path: Path) -> None:
    from fedsim.storage import Store

    Store(str(path.parent)).write_bytes(path.name, b"new\n")


def _partition(path: Path) -> None:
    import numpy as np

    from fedsim.data import Partition

    Partition((np.arange(2),), (np.arange(1),)).save(path)


# how fedsim replaces a file whole -> the write, called on the file's path
FILE_WRITERS: dict[str, Callable[[Path], None]] = {
    "atomic.write_text (summary.json, config.yaml, ...)": _atomic,
    "Store.write_bytes (results.md, sweep.json, a tuning's chosen configs)": _store,
    "Partition.save (partition.npz)": _partition,
}


@pytest.mark.parametrize("where", ["the file", "its temporary name"])
@pytest.mark.parametrize("write", list(FILE_WRITERS))
def test_a_file_fedsim_replaces_never_writes_through_a_link(tmp_path, write, where):
    """The link at the file itself is replaced; one planted at the temporary name fedsim used to write first
    (``.NAME.PID.tmp``) is never opened (the temporary file is made fresh)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    path = folder / "results.md"
    planted = path if where == "the file" else folder / f".{path.name}.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    FILE_WRITERS[write](path)
    assert victim.read_text() == "precious\n"
    assert path.is_file() and not path.is_symlink()


def test_a_restore_stages_in_a_fresh_folder_a_planted_link_cannot_redirect(tmp_path):
    """The staging folder was ``runs/.NAME.PID.restoring``: a link planted there sent the extraction outside
    --runs and left the run folder a link."""
    import tarfile

    from fedsim.reproduce import archive

    run_dir = make_run(tmp_path / "made", "r", "fedavg", [[0.5, 0.6]])
    kept = tmp_path / "kept"
    kept.mkdir()
    with tarfile.open(archive.path_of(kept, "r"), "w:gz") as tar:
        for name in archive.KEPT:
            tar.add(run_dir / name, arcname=name)
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    runs.mkdir()
    outside.mkdir()
    (runs / f".r.{os.getpid()}.restoring").symlink_to(outside, target_is_directory=True)
    assert archive.restore(kept, runs, "r")
    assert list(outside.iterdir()) == []
    assert (runs / "r").is_dir() and not (runs / "r").is_symlink()
    assert sorted(p.name for p in (runs / "r").iterdir()) == sorted(archive.KEPT)
