"""Hostile sweep ledgers and run folders (issue 47, item 3): an entry of ``_sweeps/NAME/sweep.json`` counts only
for the sweep and the settings that wrote it, "finished" means the summary records the config's rounds, and a
malformed ledger is one line naming the file and the field before Ray starts. No Ray is started here."""
import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from conftest import synthetic_tree, write_yaml
from fedsim.cli.main import main
from fedsim.sweep import executor
from fedsim.sweep.executor import Sweep, _actions
from fedsim.sweep.expand import expand_sweep
from fedsim.sweep.runs import status
from fedsim.sweep.trial import FINISHED, TuneReporter, _replay_folder


def _sweep(tmp_path, rounds: int = 3):
    tree = synthetic_tree(tmp_path, "led", **{"train.rounds": rounds}, sweep={"algorithm": ["fedavg", "fedper"]})
    configs = expand_sweep(tree)
    return tree, configs, Sweep("led", configs, configs[0].search)


def _folder(cfg, rounds: int, summary: bool = True) -> None:
    """A run folder as a run of ``rounds`` rounds of ``cfg``'s settings leaves it."""
    folder = write_yaml(Path(cfg.out_dir, cfg.name, "config.yaml"),
                        {**cfg.model_dump(), "train": {**cfg.model_dump()["train"], "rounds": rounds}}).parent
    (folder / "rounds.jsonl").write_text("".join(json.dumps({"round": r}) + "\n" for r in range(1, rounds + 1)))
    if summary:
        (folder / "summary.json").write_text(json.dumps({"rounds": rounds, "acc": {"mean": 0.5}}))


def _ledger(sweep: Sweep, text: str) -> None:
    Path(sweep.folder).mkdir(parents=True, exist_ok=True)
    (Path(sweep.folder) / "sweep.json").write_text(text)


def test_a_stale_ledger_entry_for_a_shorter_run_is_brought_to_completion_never_listed(tmp_path):
    """The red-team case: a 1-round run's folder and a ledger entry naming it, under a 3-round sweep."""
    _, configs, sweep = _sweep(tmp_path)
    _folder(configs[0], rounds=1)
    _ledger(sweep, json.dumps({"sweep": sweep.id, "stopped": {configs[0].name: {"round": 1}}}))  # as e1de928 wrote
    said: list[str] = []
    stopped = sweep.stopped_runs(said.append)
    assert stopped == {} and len(said) == 1 and configs[0].name in said[0] and "other settings" in said[0]
    with ExitStack() as stack:
        runs, _ = _actions(configs, stopped, stack, said.append)
    assert runs[configs[0].name].action == "resume"


def test_an_entry_of_another_sweep_or_other_settings_never_counts_and_one_of_its_own_does(tmp_path):
    _, configs, sweep = _sweep(tmp_path)
    own = {"round": 2, "config": sweep.fingerprints[configs[1].name], "fairness/acc_mean": 0.4}
    entries = {configs[0].name: {"round": 2, "config": "0" * 16}, configs[1].name: own}
    _ledger(sweep, json.dumps({"sweep": sweep.id, "stopped": entries}))
    said: list[str] = []
    assert sweep.stopped_runs(said.append) == {configs[1].name: own}
    assert len(said) == 1 and configs[0].name in said[0]
    _ledger(sweep, json.dumps({"sweep": "led-0badc0de", "stopped": entries}))
    said.clear()
    assert sweep.stopped_runs(said.append) == {}
    assert len(said) == 1 and "written by sweep led-0badc0de" in said[0]
    # The settings differ in train.rounds alone: a 1-round sweep's entry is not the 3-round sweep's.
    _, _, shorter = _sweep(tmp_path / "short", rounds=1)
    assert shorter.fingerprints[configs[1].name] != sweep.fingerprints[configs[1].name]


def test_a_summary_of_another_round_count_is_not_finished(tmp_path):
    """config.yaml says 3 rounds (a resume extending a 1-round run rewrote it, then broke): not finished."""
    _, configs, _ = _sweep(tmp_path)
    _folder(configs[0], rounds=3)
    (tmp_path / configs[0].name / "summary.json").write_text(json.dumps({"rounds": 1}))
    assert status(configs[0]) == "resumable"
    (tmp_path / configs[0].name / "summary.json").write_text(json.dumps({"rounds": 3}))
    assert status(configs[0]) == "finished"


def test_a_replayed_folder_of_a_shorter_run_is_never_reported_finished(tmp_path, monkeypatch):
    reported: list[dict] = []
    monkeypatch.setattr("fedsim.sweep.trial.report", reported.append)
    _, configs, _ = _sweep(tmp_path)
    _folder(configs[0], rounds=1)
    _replay_folder(configs[0], TuneReporter(3))
    assert not any(FINISHED in r for r in reported)


@pytest.mark.parametrize("text, named", [
    ('{"sweep": "x", "stopped": null}', "field stopped:"),
    ('{"sweep": "x", "stopped": {"a": {"round": "two"}}}', "field stopped.a.round:"),
    ('{"sweep": 5, "stopped": {}}', "field sweep:"),
    ('{"sweep": "x", "stopped": {"a": {"round": 1, "config": 7}}}', "field stopped.a.config:"),
    ('{"sweep": "x", "stopped": [}', "not JSON"),
    ('["sweep"]', "field (the top level):"),
])
def test_a_malformed_ledger_is_one_line_naming_file_and_field_before_ray_starts(tmp_path, monkeypatch, capsys,
                                                                                 text, named):
    def ray_starts(*args, **kwargs):
        raise AssertionError("Ray started before the ledger was read")

    monkeypatch.setattr(executor, "connect", ray_starts)
    tree, _, sweep = _sweep(tmp_path)
    _ledger(sweep, text)
    assert main(["sweep", str(write_yaml(tmp_path / "led.yaml", tree))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{sweep.folder}/sweep.json: {named}" in err, err
