"""A run folder is input: what resume verifies before it rewrites anything (issue 24)."""
import json
import shutil

import numpy as np
import pytest
from conftest import read_jsonl, synthetic_tree

from fedsim.cli import main as cli
from fedsim.config import validate
from fedsim.core import checkpoint
from fedsim.engine.runfolder import RunFolder
from fedsim.engine.runfolder_checks import load_run_config, open_for_resume
from fedsim.simulate import run

FILES = ("metrics.jsonl", "rounds.jsonl", "comm.jsonl")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, local_ray):
    """A finished 4-round run with a checkpoint every round; each test works on its own copy."""
    root = tmp_path_factory.mktemp("finished")
    run(validate(synthetic_tree(root, "done", train__rounds=4, train__eval_every=1)))
    return root / "done"


def copy_of(finished, tmp_path):
    target = tmp_path / "done"
    shutil.copytree(finished, target)
    return target


def contents(run_dir):
    return {name: (run_dir / name).read_bytes() for name in FILES}


def resume(run_dir, *extra):
    return cli.main(["run", "--resume", str(run_dir), "--quiet", *extra])


def test_a_cut_line_mid_file_is_refused_with_its_line_and_nothing_rewritten(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[3] = lines[3][:20]  # a line cut in the middle of the file
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    before = contents(run_dir)
    assert resume(run_dir, "train.rounds=5") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run_dir / 'metrics.jsonl'}:4: not a result row" in err
    assert contents(run_dir) == before


def test_a_torn_last_line_is_the_one_damage_resume_absorbs(finished, tmp_path):
    from fedsim.core.results import read_results

    run_dir = copy_of(finished, tmp_path)
    text = (run_dir / "rounds.jsonl").read_text()
    (run_dir / "rounds.jsonl").write_text(text + '{"round": 5, "seco')  # a crash mid-write of round 5
    assert [r["round"] for r in read_results(run_dir / "rounds.jsonl")] == [1, 2, 3, 4]


def test_a_missing_round_row_is_refused(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    rows = (run_dir / "rounds.jsonl").read_text().splitlines()
    (run_dir / "rounds.jsonl").write_text("\n".join(rows[:1] + rows[2:]) + "\n")  # round 2 gone
    assert resume(run_dir, "train.rounds=5") == 2
    assert "no row for round 2 though the checkpoint is at round 4" in capsys.readouterr().err


@pytest.mark.parametrize("edit", [{"round": -3}, {"round": 7}, {"round": "4"}])
def test_a_tampered_state_json_makes_its_checkpoint_not_intact(finished, tmp_path, edit):
    run_dir = copy_of(finished, tmp_path)
    state_path = run_dir / "checkpoints" / "round-0004" / "state.json"
    state_path.write_text(json.dumps({**json.loads(state_path.read_text()), **edit}))
    assert checkpoint.latest(run_dir).name == "round-0003"  # the fallback is real: round 4 is redone


def test_float16_weights_make_a_checkpoint_not_intact(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    path = run_dir / "checkpoints" / "round-0004" / "global.npy"
    np.save(path, np.load(path).astype(np.float16))
    assert checkpoint.latest(run_dir).name == "round-0003"


def test_a_checkpoint_beyond_train_rounds_is_refused(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    cfg = load_run_config(run_dir, ["train.rounds=3"])
    from fedsim.plan.build import load_inputs

    with pytest.raises(Exception, match="train.rounds: the run's checkpoint is at round 4, beyond train.rounds=3"):
        open_for_resume(RunFolder(cfg), load_inputs(cfg).data)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_and_sigterm_say_how_to_continue_in_one_line(tmp_path, sig, code):
    import signal
    import subprocess
    import sys
    import time

    import yaml

    config = tmp_path / "long.yaml"
    config.write_text(yaml.safe_dump(synthetic_tree(tmp_path, "long", train__rounds=200, engine__workers=1)))
    # A shell starts background jobs with SIGINT ignored and a child inherits that; the run gets Ctrl-C as a
    # terminal's foreground job would, however pytest itself was started.
    proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", "run", str(config), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    rows, deadline = tmp_path / "long" / "rounds.jsonl", time.time() + 240
    while not (rows.exists() and rows.read_text().count("\n") >= 1):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    assert f"fedsim: interrupted; continue with `fedsim run --resume {tmp_path / 'long'}`" in err
    assert "Traceback" not in err


def test_a_flipped_byte_in_a_checkpoint_file_makes_it_not_intact(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    for name in ("global.npy", "worker-0.npz"):
        target = copy_of(finished, tmp_path / name) if name != "global.npy" else run_dir
        path = target / "checkpoints" / "round-0004" / name
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x01  # one mantissa bit of the last value, or a byte of the shard
        path.write_bytes(bytes(data))
        assert checkpoint.latest(target).name == "round-0003", name
        state = json.loads((target / "checkpoints" / "round-0004" / "state.json").read_text())
        assert set(state["digests"]) >= {"global.npy", "worker-0.npz", "worker-1.npz"}


def test_an_edited_partition_is_refused_on_resume(finished, tmp_path, capsys):
    from fedsim.data import Partition

    run_dir = copy_of(finished, tmp_path)
    part = Partition.load(run_dir / "partition.npz")
    swapped = (part.train[1], part.train[0], *part.train[2:])  # two clients swapped
    Partition(swapped, part.test, part.label_maps).save(run_dir / "partition.npz")
    assert resume(run_dir, "train.rounds=5") == 2
    assert "not the partition this run's checkpoints were trained on" in capsys.readouterr().err


def test_data_changed_in_place_under_its_old_digest_is_refused(finished, tmp_path):
    import dataclasses

    from fedsim.data import DataError
    from fedsim.plan.build import load_inputs

    run_dir = copy_of(finished, tmp_path)
    cfg = load_run_config(run_dir)
    data = load_inputs(cfg).data
    labels = data.train_y.copy()
    labels[0] = (labels[0] + 1) % len(data.classes)  # one label edited; the cache still records the old digest
    tampered = dataclasses.replace(data, train_y=labels)
    with pytest.raises(DataError, match="data changed since this run started"):
        open_for_resume(RunFolder(cfg), tampered)
    open_for_resume(RunFolder(cfg), data)  # the data it started on passes


def test_an_interrupt_that_lands_in_c_code_is_still_an_interrupt():
    """SIGTERM's handler raising while C code runs comes back as a SystemError; the run must still stop as
    interrupted (exit 143 with the resume command), not as a failed run naming a SystemError."""
    from fedsim.engine.session import _interrupt_behind

    class Terminated(BaseException):
        pass

    try:
        try:
            raise Terminated()
        except Terminated as signal_raised:
            raise SystemError("<built-in method __new__> returned a result with an exception set") from signal_raised
    except SystemError as wrapped:
        assert isinstance(_interrupt_behind(wrapped), Terminated)
    assert _interrupt_behind(RuntimeError("a real failure")) is None


def test_an_in_process_cli_leaves_its_callers_ray_up(finished, tmp_path, local_ray):
    """main() ends the Ray it started (a command line's); one its caller started (a notebook's) stays up."""
    run_dir = copy_of(finished, tmp_path)
    assert resume(run_dir, "train.rounds=5") == 0
    assert [row["round"] for row in read_jsonl(run_dir / "rounds.jsonl")] == [1, 2, 3, 4, 5]
    assert local_ray.is_initialized()


def test_the_resume_command_a_failure_prints_carries_trust_plugins_when_the_config_names_code(tmp_path):
    from conftest import lightning_tree

    from fedsim.errors import RunFailed

    own = RunFolder(validate(lightning_tree(tmp_path, "TwoPartModule")))
    assert own.resume_command == f"fedsim run --resume {tmp_path / 'lm'} --trust-plugins"
    assert RunFailed("cause", own.location, names_code=own.names_code).resume_command == own.resume_command
    assert RunFolder(validate(synthetic_tree(tmp_path, "p"))).resume_command == f"fedsim run --resume {tmp_path / 'p'}"
    assert own.written() == "its config and partition, no checkpoint yet (resume starts at round 1)"


def test_overwrite_removes_what_an_old_run_exported_never_what_a_link_points_to(tmp_path):
    """`--overwrite` starts a run without the old one's results: its exports and Lightning's checkpoint files
    (folders made from its results) go too, or they would sit beside the new results as theirs. A planted link
    is removed as a link: what it points to stays."""
    from conftest import synthetic_tree

    from fedsim.config import validate
    from fedsim.core import runfiles
    from fedsim.engine.runfolder import RunFolder
    from fedsim.plan.build import load_inputs

    cfg = validate(synthetic_tree(tmp_path, "over"))
    run_dir = tmp_path / cfg.name
    (run_dir / runfiles.EXPORT / "round-0005").mkdir(parents=True)
    (run_dir / runfiles.EXPORT / "round-0005" / "client-0.pt").write_bytes(b"an old run's model")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    (run_dir / runfiles.LIGHTNING).symlink_to(outside)
    inputs = load_inputs(cfg)
    RunFolder(cfg).create(inputs.partition, inputs.data)
    assert not (run_dir / runfiles.EXPORT).exists() and not (run_dir / runfiles.LIGHTNING).is_symlink()
    assert (outside / "keep.txt").read_text() == "kept" and (run_dir / runfiles.CONFIG).exists()
