"""Files fedsim reads back that are not what it wrote (issue 66, item 1): a FIFO would block the read forever, a
symbolic link would read a file outside the folder. Every reader of a run folder, a sweep's ledger, a kept archive
and a config is listed in READERS: each is refused in one line naming the file, without blocking. A new file
fedsim reads is covered by adding its reader to the list. No Ray is started here."""
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_run, unblocking

# (file, its reader) -> how the reader is called on a run folder holding the file
READERS: dict[tuple[str, str], Callable[[Path], object]] = {}


def reader(file: str, who: str):
    def register(call: Callable[[Path], object]) -> Callable[[Path], object]:
        READERS[(file, who)] = call
        return call
    return register


@reader("metrics.jsonl", "fedsim report")
@reader("summary.json", "fedsim report")
@reader("config.yaml", "fedsim report")
def _report(run_dir: Path) -> object:
    from fedsim.metrics.report_runs import load_run

    return load_run(run_dir)


@reader("metrics.jsonl", "fedsim export's logged accuracies")
def _export_logged(run_dir: Path) -> object:
    from fedsim.cli.export import logged_accuracies

    return logged_accuracies(run_dir, 1, "acc")


@reader("rounds.jsonl", "run --resume")
def _resume_rows(run_dir: Path) -> object:
    from fedsim.core.results import read_results

    return read_results(run_dir / "rounds.jsonl")


@reader("rounds.jsonl", "fedsim reproduce")
def _reproduce_seconds(run_dir: Path) -> object:
    from fedsim.reproduce.runner import run_seconds

    return run_seconds(run_dir)


@reader("summary.json", "fedsim reproduce")
def _reproduce_summary(run_dir: Path) -> object:
    from fedsim.reproduce.runner import read_summary

    return read_summary(run_dir)


@reader("config.yaml", "fedsim export")
def _export_config(run_dir: Path) -> object:
    from fedsim.engine.runfolder_checks import load_run_config

    return load_run_config(str(run_dir), [], trust_plugins=False)


@reader("config.yaml", "the tuning receipt")
def _receipt(run_dir: Path) -> object:
    from fedsim.metrics.receipt import stored_config

    return stored_config(run_dir)


@reader("partition.npz", "run --resume")
def _partition(run_dir: Path) -> object:
    from fedsim.data import Partition

    return Partition.load(run_dir / "partition.npz")


@reader("checkpoints/round-0001/state.json", "run --resume")
@reader("checkpoints/round-0001/global.npy", "run --resume")
def _checkpoint(run_dir: Path) -> object:
    from fedsim.core import checkpoint

    return checkpoint.read_state(run_dir / "checkpoints" / "round-0001", "fingerprint", 1)


@reader("sweep.json", "fedsim sweep")
def _ledger(folder: Path) -> object:
    from fedsim.sweep import ledger

    return ledger.read_stopped(str(folder), "sweep-id", {}, print)


@reader("kept.tar.gz", "fedsim reproduce --dry-run")
def _kept_archive(folder: Path) -> object:
    from fedsim.reproduce import archive

    (folder / "runs").mkdir(exist_ok=True)
    return archive.restore(folder, folder / "runs", "kept")


def _every_file_read_back(tmp_path: Path) -> Path:
    """A run folder holding, as fedsim writes them, every file READERS reads (a sweep's ledger and a kept archive
    beside them): a probe then replaces one."""
    import json
    import tarfile

    import numpy as np

    from fedsim.data import Partition

    run_dir = make_run(tmp_path, "r", "fedavg", [[0.5, 0.6]])
    Partition((np.arange(3),), (np.arange(2),)).save(run_dir / "partition.npz")
    ckpt = run_dir / "checkpoints" / "round-0001"
    ckpt.mkdir(parents=True)
    np.save(ckpt / "global.npy", np.zeros(1, np.float32))
    (ckpt / "state.json").write_text(json.dumps({"round": 1, "workers": [], "fingerprint": "fingerprint"}))
    (run_dir / "sweep.json").write_text(json.dumps({"sweep": "sweep-id", "stopped": {}}))
    with tarfile.open(run_dir / "kept.tar.gz", "w:gz") as tar:
        for name in ("config.yaml", "summary.json", "rounds.jsonl", "metrics.jsonl"):
            tar.add(run_dir / name, arcname=name)
    return run_dir


def _planted(path: Path, kind: str, victim: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(victim)


def _outcome(call: Callable[[], object], fifo: Path | None, wait_s: float = 10.0) -> BaseException | None:
    """``call()``'s exception (None when it returned), failing the probe when it is still blocked after ``wait_s``
    (a writer then opens the FIFO so the thread ends)."""
    outcome: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            call()
            outcome["error"] = None
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        if fifo is not None:
            unblocking(fifo).join()
        pytest.fail(f"still blocked after {wait_s:g} s")
    return outcome["error"]


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
@pytest.mark.parametrize("file, who", list(READERS), ids=[f"{f} ({w})" for f, w in READERS])
def test_a_file_fedsim_reads_back_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path, file, who, kind):
    run_dir = _every_file_read_back(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("not this run's\n")
    path = run_dir / file
    _planted(path, kind, victim)
    error = _outcome(lambda: READERS[(file, who)](run_dir), path if kind == "fifo" else None)
    assert isinstance(error, ValueError), f"read through: {error!r}"
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    assert ("a FIFO" if kind == "fifo" else "a symbolic link") in message, message


def test_a_config_named_on_the_command_line_that_is_a_fifo_is_one_line(in_tmp, capsys):
    from fedsim.cli.main import main

    fifo = in_tmp / "cfg.yaml"
    os.mkfifo(fifo)
    error = _outcome(lambda: main(["run", str(fifo), "--dry-run"]), fifo)
    err = capsys.readouterr().err.strip()
    assert error is None and err.count("\n") == 0 and str(fifo) in err, err
