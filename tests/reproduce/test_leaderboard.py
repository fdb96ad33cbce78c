"""`fedsim reproduce leaderboard`: every method x setting x seed planned and valid, the table computed from run
folders (mean and 95% interval over seeds, best and final round, p10, Jain, time per round, PFLlib beside), a
diverged run recorded as a result and never retried, and the paper-scale plan dry-run."""
import json
import math

import pytest

from fedsim.cli.main import main
from fedsim.errors import TrainingDiverged
from fedsim.metrics.confidence import t975
from fedsim.metrics.summary import summarize
from fedsim.reproduce import leaderboard


def test_every_method_and_setting_is_planned_seed_major_and_valid(tmp_path):
    planned = leaderboard.plan("cpu", 2, tmp_path)
    per_seed = len(leaderboard.SETTINGS) * len(leaderboard.ENTRIES)
    assert len(planned) == 2 * per_seed and [p.seed for p in planned] == [0] * per_seed + [1] * per_seed
    assert len({p.config.name for p in planned}) == len(planned)
    dirichlet = next(p.config for p in planned if p.key == "dirichlet-fedbabu")
    assert dirichlet.data.partition.beta == 0.1 and dirichlet.eval.finetune_epochs == 5
    assert next(p.config for p in planned if p.key == "pathological-ifca").data.partition.k == 10
    with pytest.raises(Exception, match="--only: the leaderboard has no method 'fedfoo'"):
        leaderboard.plan("cpu", 1, tmp_path, only="fedfoo")


def _finish(item, final: list[float], best: float, seconds: float, picked_on: str | None = None) -> None:
    """What a finished run leaves that the leaderboard reads: summary.json and rounds.jsonl (``picked_on``: how its
    best round was picked; None: a summary written before data.validation)."""
    item.folder.mkdir(parents=True)
    metric = "acc_personalized" if item.key.endswith("fedbabu") else "acc"
    best_round = {"round": 5, **summarize(final), "mean": best, **({"picked_on": picked_on} if picked_on else {})}
    summary = {metric: summarize(final), "best_round": {metric: best_round}}
    (item.folder / "summary.json").write_text(json.dumps(summary))
    rounds = item.config.train.rounds
    (item.folder / "rounds.jsonl").write_text("".join(json.dumps({"round": r, "seconds": seconds / rounds}) + "\n"
                                                      for r in range(1, rounds + 1)))


def test_the_table_is_computed_from_the_finished_run_folders(tmp_path):
    planned = leaderboard.plan("cpu", 3, tmp_path, only="fedper")
    finals = {0: [0.5, 0.7], 1: [0.6, 0.8], 2: [0.4, 0.6]}  # client means 60, 70, 50 points
    for item in planned:
        if item.key == "pathological-fedper":
            _finish(item, finals[item.seed], best=0.75, seconds=80.0)
    stats = leaderboard.evaluate(planned, tmp_path)["pathological"]["fedper"]
    half = t975(2) * 10.0 / math.sqrt(3)  # std of (60, 70, 50) is 10
    assert stats["seeds"] == 3 and math.isclose(stats["final"]["mean"], 60.0)
    assert math.isclose((stats["final"]["high"] - stats["final"]["low"]) / 2, half)
    assert math.isclose(stats["best"]["mean"], 75.0) and stats["best"]["low"] == stats["best"]["high"] == 75.0
    assert math.isclose(stats["p10"], sum(100 * summarize(v)["p10"] for v in finals.values()) / 3)
    assert math.isclose(stats["seconds"], 2.0)  # 80 s over 40 rounds
    text = leaderboard.render(leaderboard.evaluate(planned, tmp_path), "cpu", planned, "cmd")
    assert f"| `fedper` | own model | 60.00 ± {half:.2f} | 75.00 ± 0.00 (on test) | 5 |" in text  # no validation
    assert "| PFLlib % (best on test) |" in text
    assert ("| `fedper` | fedper (keep_personal True) | sgd | 0.05 | 0 | 40 | 1 epoch(s) of batch 10, f = 1 | initial "
            "(the model each client holds) | final; best round on test, shown as PFLlib reports it, not a selection | "
            "0, 1, 2 |") in text  # its receipt
    assert "| 3 | 63.53 ± 0.21 |" in text  # PFLlib's FedPer, pathological
    assert "| `fedbabu` | personalized (fine-tuned) | not run yet |" in text
    # PFLlib's FedProto number scores the nearest global prototype, not the client's own classifier: the row says so.
    assert ("| `fedproto` | own model; PFLlib's % scores the nearest global prototype (fedsim's: "
            "fedproto_acc_prototypes) | not run yet |") in text


def test_a_best_round_picked_on_validation_is_not_marked_as_on_test(tmp_path):
    planned = leaderboard.plan("cpu", 2, tmp_path, only="fedper")
    for item in planned:
        if item.key == "pathological-fedper":
            _finish(item, [0.5, 0.7], best=0.65, seconds=40.0, picked_on="validation")
    text = leaderboard.render(leaderboard.evaluate(planned, tmp_path), "cpu", planned, "cmd")
    assert "| `fedper` | own model | 60.00 ± 0.00 | 65.00 ± 0.00 | 5 |" in text


def test_a_diverged_run_is_a_result_recorded_once(tmp_path, monkeypatch):
    planned = leaderboard.plan("cpu", 1, tmp_path, only="fedamp")
    calls = []

    def execute(items, say, **_):
        calls.append(items[0].config.name)
        raise TrainingDiverged("client 3, round 2: training loss is not finite")

    monkeypatch.setattr(leaderboard, "execute", execute)
    leaderboard.complete(planned, tmp_path, say=lambda _: None)
    leaderboard.complete(planned, tmp_path, say=lambda _: None)  # resumed: not retried
    assert calls == [p.config.name for p in planned]
    stats = leaderboard.evaluate(planned, tmp_path)["dirichlet"]["fedamp"]
    assert stats["seeds"] == 0 and "round 2" in stats["diverged"][0]
    assert "| `fedamp` | own model | diverged (1 diverged: client 3" in leaderboard.render(
        leaderboard.evaluate(planned, tmp_path), "cpu", planned, "cmd")
    changed = leaderboard.plan("cpu", 1, tmp_path, ["train.body.lr=0.01"], only="fedamp")
    assert leaderboard.Diverged(tmp_path).of(changed[0]) is None  # other settings: run again


def test_the_paper_scale_plan_dry_runs(tmp_path, capsys, data_root):
    assert main(["reproduce", "leaderboard", "--scale", "paper", "--dry-run", "--only", "fedavg", "--seeds", "1",
                 "--runs", str(tmp_path), "--kept", str(tmp_path / "kept")]) == 0
    out = capsys.readouterr().out
    assert "leaderboard-paper-pathological-fedavg-s0" in out and "2000" in out
