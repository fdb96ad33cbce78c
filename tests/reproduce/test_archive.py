"""Kept runs (``fedsim/reproduce/archive.py``): a finished run's results archived beside the report and put back on
another machine as they were; a bad archive refused in one line, never half-restored; a local folder never
replaced."""
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import TESTS

from fedsim.cli.reproduce import KEPT_DEFAULT, RUNS_DEFAULT
from fedsim.errors import ConfigError
from fedsim.reproduce import archive

FILES = {"config.yaml": "name: r\n", "summary.json": '{"rounds": 2}', "rounds.jsonl": '{"round": 1}\n',
         "metrics.jsonl": '{"round": 1, "client": 0}\n'}


def _finished(root: Path, name: str = "run-s0", model: bool = False) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for file, text in FILES.items():
        (folder / file).write_text(text)
    (folder / "checkpoints").mkdir()  # scratch: never kept
    if model:
        (folder / "model.npz").write_bytes(b"weights")
    os.utime(folder / "summary.json", (1_000_000, 1_000_000))
    return folder


def test_a_finished_run_comes_back_with_its_files_and_their_times(tmp_path):
    folder = _finished(tmp_path / "here", model=True)
    kept = tmp_path / "kept"
    archive.keep(folder, kept, with_model=True)
    assert archive.is_kept(folder, kept, with_model=True)
    there = tmp_path / "there"
    there.mkdir()
    assert archive.restore(kept, there, "run-s0")
    back = there / "run-s0"
    assert sorted(p.name for p in back.iterdir()) == sorted([*FILES, "model.npz"])  # no checkpoints
    assert all((back / f).read_text() == text for f, text in FILES.items())
    assert (back / "summary.json").stat().st_mtime == 1_000_000  # what tells a stale dependant
    assert not archive.restore(kept, there, "run-s0")  # there now: never replaced
    assert not archive.restore(kept, there, "never-kept")


def test_an_unfinished_run_is_not_kept_and_a_newer_finish_is_kept_again(tmp_path):
    folder = _finished(tmp_path)
    (folder / "summary.json").unlink()
    with pytest.raises(ConfigError, match="cannot archive an unfinished run \\(no summary.json\\)"):
        archive.keep(folder, tmp_path / "kept")
    assert not (tmp_path / "kept" / "run-s0.tar.gz").exists()
    (folder / "summary.json").write_text("{}")
    archive.keep(folder, tmp_path / "kept")
    assert archive.is_kept(folder, tmp_path / "kept") and not archive.is_kept(folder, tmp_path / "kept", True)
    later = (tmp_path / "kept" / "run-s0.tar.gz").stat().st_mtime + 10
    os.utime(folder / "summary.json", (later, later))  # it ran again since
    assert not archive.is_kept(folder, tmp_path / "kept")


def _tar(path: Path, members: dict[str, bytes], link: str | None = None) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)


GOOD = {name: text.encode() for name, text in FILES.items()}


@pytest.mark.parametrize("members, link, why", [
    ({**GOOD, "../escape.json": b"x"}, None, "holds '../escape.json'"),
    ({**GOOD, "plugin.py": b"import os"}, None, "holds 'plugin.py'"),
    (GOOD, "metrics2.jsonl", "holds 'metrics2.jsonl'"),
    ({k: v for k, v in GOOD.items() if k != "summary.json"}, None, "lacks summary.json"),
])
def test_a_bad_archive_is_refused_in_one_line_and_nothing_is_restored(tmp_path, members, link, why):
    kept, runs = tmp_path / "kept", tmp_path / "runs"
    kept.mkdir(), runs.mkdir()
    _tar(kept / "run-s0.tar.gz", members, link)
    with pytest.raises(ConfigError) as err:
        archive.restore(kept, runs, "run-s0")
    text = str(err.value)
    assert "\n" not in text and why in text and "remove" in text and "to run that run again" in text
    assert list(runs.iterdir()) == []


def test_a_truncated_archive_is_refused_in_one_line(tmp_path):
    folder, kept = _finished(tmp_path / "here"), tmp_path / "kept"
    target = archive.keep(folder, kept)
    target.write_bytes(target.read_bytes()[:40])
    (tmp_path / "runs").mkdir()
    with pytest.raises(ConfigError, match="not a readable run archive"):
        archive.restore(kept, tmp_path / "runs", "run-s0")
    assert list((tmp_path / "runs").iterdir()) == []


def test_the_default_kept_folder_is_committed_not_ignored():
    """The runs folder is scratch and ignored; the kept runs must travel with the repository."""
    repo = TESTS.parent
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "check-ignore", "-q", "--no-index", f"{KEPT_DEFAULT}/a-run-s0.tar.gz"], cwd=repo)
    assert probe.returncode == 1, f"{KEPT_DEFAULT} is ignored by git: its kept runs would not reach the next machine"
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", "runs/x/summary.json"], cwd=repo).returncode == 0


def test_the_repositorys_kept_runs_name_their_start_relative_to_the_repository(tmp_path):
    """The committed LG-FedAvg runs name the FedAvg run they started from relative to the repository, never by a
    path of the machine that ran them; restored into a runs folder elsewhere, every kept run of the FedBABU suite is
    finished, none changed."""
    from fedsim.reproduce import PAPERS
    from fedsim.reproduce.restore import restore_kept
    from fedsim.reproduce.runner import plan
    from fedsim.sweep.runs import status

    kept = TESTS.parent / KEPT_DEFAULT
    paper = PAPERS["fedbabu"]
    planned = [item for item in plan(paper, paper.claims, "cpu", None, tmp_path / "runs")
               if archive.path_of(kept, item.config.name).exists()]
    dependent = [item for item in planned if item.needs]
    if not dependent:
        pytest.skip(f"{KEPT_DEFAULT} holds no kept run that starts from another")
    for item in dependent:
        stored = yaml.safe_load(tarfile.open(archive.path_of(kept, item.config.name)).extractfile("config.yaml"))
        assert (stored["out_dir"], stored["model"]["init_from"]) == \
            (RUNS_DEFAULT, f"{RUNS_DEFAULT}/{item.needs[0].name}"), item.config.name
    assert restore_kept(planned, kept) == len(planned)
    assert {item.config.name: status(item.config) for item in planned} == \
        {item.config.name: "finished" for item in planned}


def test_every_kept_archive_of_the_repository_is_within_the_bounds():
    """The bounds (issue 47) sit far above what a kept run holds."""
    kept = sorted((TESTS.parent / "reproduction" / "runs").glob("*.tar.gz"))
    if not kept:
        pytest.skip("no kept runs in this checkout")
    for source in kept:
        assert archive.KEPT[0] in archive._members(source)


def test_no_kept_run_of_the_repository_names_a_path_of_the_machine_that_ran_it():
    """A kept run's config.yaml names its runs folder, and any run it started from, relative to the repository, so
    the record reads the same on every clone (fedsim reproduce records --runs so: storage.portable)."""
    kept = sorted((TESTS.parent / KEPT_DEFAULT).glob("*.tar.gz"))
    if not kept:
        pytest.skip("no kept runs in this checkout")
    for source in kept:
        stored = yaml.safe_load(tarfile.open(source).extractfile("config.yaml"))
        named = [stored["out_dir"], stored["model"].get("init_from") or RUNS_DEFAULT]
        assert all(path == RUNS_DEFAULT or path.startswith(f"{RUNS_DEFAULT}/") for path in named), source.name


def test_the_dry_run_over_the_repositorys_kept_runs_leaves_nothing_to_run(tmp_path, capsys, data_root, monkeypatch):
    """`fedsim reproduce fedbabu --dry-run` on a fresh clone, run from another folder without --kept: the clone's
    kept runs (LG-FedAvg's from another machine's FedAvg among them) are found, put back and checked as their runs
    would take them (replayed, never started anew): none changed, none left."""
    from fedsim.cli.main import main

    kept = TESTS.parent / KEPT_DEFAULT
    if not any(kept.glob("fedbabu-cpu-lg_fedavg-s*.tar.gz")):
        pytest.skip(f"{KEPT_DEFAULT} holds no kept LG-FedAvg run")
    monkeypatch.chdir(tmp_path)  # no reproduction/runs here
    assert main(["reproduce", "fedbabu", "--dry-run", "--only", "fedbabu-best", "--runs", str(tmp_path / "runs")]) \
        == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"kept runs: {kept.resolve()} (the working folder has no {KEPT_DEFAULT}" in out
    assert ": changed" not in out and "fedbabu-cpu-lg_fedavg-s0: finished" in out
    assert "fedbabu-cpu-lg_fedavg-m0-s4: finished" in out and "left: 0 runs" in out


def test_kept_runs_found_nowhere_are_said_with_the_flag_that_names_them(tmp_path, capsys, monkeypatch):
    """An installed fedsim (no clone around it), run from a folder without reproduction/runs: where it looked and
    --kept, instead of every run silently counted as left."""
    import fedsim
    from fedsim.cli.reproduce import kept_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fedsim, "__file__", str(tmp_path / "site-packages" / "fedsim" / "__init__.py"))
    assert kept_folder(KEPT_DEFAULT) == tmp_path.resolve() / KEPT_DEFAULT
    err = capsys.readouterr().err
    assert "kept runs: none found at" in err and str(tmp_path / "site-packages" / KEPT_DEFAULT) in err
    assert "--kept FOLDER" in err
    assert kept_folder("elsewhere") == tmp_path.resolve() / "elsewhere"  # a folder given is taken as given
