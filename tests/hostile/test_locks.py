"""Files that a crash, a full disk or a concurrent process must never leave broken."""
import errno
import os

import pytest
from conftest import make_image_zip

from fedsim import atomic
from fedsim.data import datasets, load_dataset
from fedsim.data.cache import build_cache
from fedsim.metrics.logger import JsonlLogger


def test_a_failed_replacement_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text('{"old": true}')

    def disk_full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="is full"):
        atomic.write_text(target, '{"new": true}')
    assert target.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left behind


def test_rounds_csv_survives_a_rebuild_that_breaks_half_way(tmp_path):
    logger = JsonlLogger()
    logger.run_dir = tmp_path
    (tmp_path / "rounds.jsonl").write_text('{"round": 1, "acc": {"mean": 0.5}}\n')
    logger._write_csv()
    before = (tmp_path / "rounds.csv").read_text()
    # A third row missing the statistic makes the writer fail after the header and two rows.
    (tmp_path / "rounds.jsonl").write_text('{"round": 1, "acc": {"mean": 0.5}}\n{"round": 2, "acc": {"mean": 0.6}}\n'
                                           '{"round": 3, "acc": {}}\n')
    with pytest.raises(KeyError):
        logger._write_csv()
    assert (tmp_path / "rounds.csv").read_text() == before


def test_cache_build_never_removes_a_cache_another_process_published(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    zpath = tmp_path / "d.zip"
    make_image_zip(zpath)
    published = load_dataset("imagefolder", zpath)  # "the other process" publishes first
    folder = next((tmp_path / "cache").iterdir())
    inode = (folder / "train_x.npy").stat().st_ino
    spec = datasets._DATASETS["imagefolder"]
    source, read = datasets._find_source(spec, zpath, download=False)
    build_cache(folder, source, read(source), spec.augmentable)  # this process finished decoding a moment later
    assert (folder / "train_x.npy").stat().st_ino == inode  # the published files were never replaced
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [folder.name]  # no temp folder left
    assert (published.train_x == load_dataset("imagefolder", zpath).train_x).all()


def test_a_full_disk_while_creating_the_run_folder_is_exit_3_and_leaves_no_config(tmp_path, monkeypatch):
    """Nothing to resume yet: the folder has no config.yaml (so it never looks resumable), and the error
    says to start again."""
    from conftest import synthetic_tree

    from fedsim.config import validate
    from fedsim.data import Partition
    from fedsim.engine.runfolder import RunFolder
    from fedsim.errors import RunFailed
    from fedsim.plan.build import load_inputs

    def disk_full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(Partition, "save", disk_full)
    cfg = validate(synthetic_tree(tmp_path, "full"))
    inputs = load_inputs(cfg)
    with pytest.raises(RunFailed, match=r"No space left on device \(.*partition.npz\); its folder .* is incomplete: "
                                        "start the run again with --overwrite"):
        RunFolder(cfg).create(inputs.partition, inputs.data)
    assert not (tmp_path / "full" / "config.yaml").exists()


# -- a planted lock file never redirects a write --------------------------------------------------------------------
def _planted(tmp_path, lock, kind: str):
    """A victim file outside the folder and ``lock`` made to reach it: a symbolic link, a hard link, or a FIFO."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock.parent.mkdir(parents=True, exist_ok=True)
    {"symlink": lambda: lock.symlink_to(victim), "hardlink": lambda: os.link(victim, lock),
     "fifo": lambda: os.mkfifo(lock)}[kind]()
    return victim


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_a_run_folders_planted_lock_is_refused_and_nothing_outside_is_written(tmp_path, kind):
    from fedsim.engine import runlock
    from fedsim.errors import ConfigError

    run_dir = tmp_path / "runs" / "r"
    victim = _planted(tmp_path, run_dir / ".lock", kind)
    for check in (runlock.refuse_if_live, lambda d: runlock.hold(d).__enter__()):
        with pytest.raises(ConfigError, match=r"\.lock: .*(symbolic link|hard link|not a regular file).*remove"):
            check(run_dir)
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_a_sweeps_planted_lock_is_refused_and_nothing_outside_is_written(tmp_path, kind):
    from conftest import synthetic_tree

    from fedsim.config import validate
    from fedsim.errors import ConfigError
    from fedsim.sweep.runs import claimed

    cfg = validate(synthetic_tree(tmp_path, "r"))
    victim = _planted(tmp_path, tmp_path / ".locks" / "r.lock", kind)  # out_dir is tmp_path
    with pytest.raises(ConfigError, match=r"r\.lock: .*(symbolic link|hard link|not a regular file).*remove"):
        with claimed(cfg):
            pass
    assert victim.read_text() == "precious\n"


def test_a_sweep_lock_is_shared_by_name_and_never_truncated(tmp_path):
    from conftest import synthetic_tree

    from fedsim.config import validate
    from fedsim.sweep.runs import claimed

    cfg = validate(synthetic_tree(tmp_path, "r"))
    with claimed(cfg) as first:
        with claimed(cfg) as second:  # another open of the same lock: refused while the first holds it
            assert first and not second
    with claimed(cfg) as again:
        assert again
