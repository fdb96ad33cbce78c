"""`fedsim tune`: the same budget and shared draws for every method, its own declared parameters beside them, a choice
read from validation scores only (test poisoned, choice unchanged), resumable after a lost run folder."""
import json
import shutil

import pytest

from conftest import tune_tree
from fedsim.algorithms import ALGORITHMS
from fedsim.errors import TuningIncomplete
from fedsim.sweep.tune import choose, plan_tuning, run_tuning, selection_key, validation_part


def test_every_method_gets_the_same_trials_seeds_rounds_and_shared_draws(tmp_path):
    plan = plan_tuning(tune_tree(tmp_path))
    assert [m.method for m in plan.methods] == ["fedavg", "fedprox", "ditto"]
    for method in plan.methods:
        assert len(method.runs) == 3 and all([c.seed for c in trial] == [0, 1] for trial in method.runs)
        assert {c.train.rounds for trial in method.runs for c in trial} == {1}
        assert all(c.algorithm.name == method.method for trial in method.runs for c in trial)
    shared = [[{k: t[k] for k in ("lr", "momentum")} for t in m.trials] for m in plan.methods]
    assert shared[0] == shared[1] == shared[2] and len({t["lr"] for t in shared[0]}) == 3  # paired, and drawn
    fedavg, fedprox, ditto = plan.methods
    assert set(fedavg.space) == {"lr", "momentum"} and set(fedprox.space) == {"lr", "momentum", "algorithm.mu"}
    assert all(t["algorithm.mu"] in (0.001, 0.01, 0.1, 1.0) for t in fedprox.trials)
    run = fedprox.runs[1][0]
    assert run.train.body.lr == run.train.head.lr == fedprox.trials[1]["lr"]
    assert run.algorithm.params["mu"] == fedprox.trials[1]["algorithm.mu"]
    again = plan_tuning(tune_tree(tmp_path))
    assert [c.name for c in again.search_runs] == [c.name for c in plan.search_runs]
    assert plan_tuning({**tune_tree(tmp_path), "seed": 4}).methods[0].trials != fedavg.trials  # from the seed


def test_a_parameter_the_config_fixes_is_not_searched(tmp_path):
    plan = plan_tuning(tune_tree(tmp_path, methods=[{"name": "fedprox", "mu": 0.5}]))
    assert set(plan.methods[0].space) == {"lr", "momentum"}
    assert {c.algorithm.params["mu"] for c in plan.search_runs} == {0.5}


def test_each_declared_tunable_parameter_is_one_its_method_takes():
    declared = {name: cls for name, cls in ALGORITHMS.items() if cls.tunable}
    assert {"fedprox", "ditto", "pfedme", "apfl", "fedamp", "ifca", "fedrep"} <= set(declared)
    for name, cls in declared.items():
        fields = {f.alias or key for key, f in cls.Params.model_fields.items()}
        assert set(cls.tunable) <= fields, name
        for key, dist in cls.tunable.items():  # every value of the range is one the method accepts
            for value in (dist.bounds if dist.kind == "choice" else dist.bounds[:1]):
                cls.Params.model_validate({key: value})


def _summary(val: float, test: float) -> dict:
    return {"acc": {"mean": test}, "acc_personalized": {"mean": test}, "validation_acc": {"mean": val},
            "validation_acc_personalized": {"mean": val}}


def test_the_key_chosen_on_is_validations_reported_accuracy(tmp_path):
    personalized, initial = plan_tuning(tune_tree(tmp_path)), plan_tuning(
        {**tune_tree(tmp_path), "eval": {"finetune_epochs": 0}})
    assert selection_key(personalized.search_runs[0]) == "validation_acc_personalized"
    assert selection_key(initial.search_runs[0]) == "validation_acc"


def test_the_choice_reads_validation_only():
    runs = [[_summary(0.5, 0.9), _summary(0.6, 0.9)], [_summary(0.7, 0.1), _summary(0.7, 0.1)],
            [_summary(0.2, 1.0), None]]
    chosen = choose("m", [[None if r is None else validation_part(r) for r in trial] for trial in runs],
                    "validation_acc_personalized")
    assert (chosen.trial, chosen.score, chosen.failed) == (1, 0.7, [2])
    assert validation_part(_summary(0.5, 0.9)) == {"validation_acc": {"mean": 0.5}, "validation_acc_personalized": {"mean": 0.5}}
    with pytest.raises(TuningIncomplete, match="every trial of m failed"):  # test keys never reach the chooser
        choose("m", [[validation_part(_summary(0.5, 0.9))]], "acc")


@pytest.mark.slow
def test_tuning_resumes_after_a_lost_run_and_never_chooses_on_test(tmp_path, local_ray):
    """Search and final runs, then: every search run's test scores poisoned (reversed), one search run folder deleted
    (a kill mid-way); the rerun trains only that run again and makes the same choice, from validation alone."""
    tree = tune_tree(tmp_path, methods=["fedavg", "fedprox"], trials=2, seeds=[0], final_seeds=2)
    plan = plan_tuning(tree)
    first = run_tuning(plan, say=lambda line: None)
    chosen = [(row["method"], row["trial"], row["chosen"]) for row in first["methods"]]
    for cfg in plan.search_runs:
        path = tmp_path / cfg.name / "summary.json"
        summary = json.loads(path.read_text())
        for key in ("acc", "acc_personalized"):
            summary[key]["mean"] = 1.0 - summary[key]["mean"]
        path.write_text(json.dumps(summary))
    lost = plan.search_runs[1].name
    shutil.rmtree(tmp_path / lost)
    lines: list[str] = []
    again = run_tuning(plan_tuning(tree), say=lines.append)
    assert [(row["method"], row["trial"], row["chosen"]) for row in again["methods"]] == chosen
    assert [line for line in lines if line.endswith(": running")] == [f"{lost}: running"]
    assert (tmp_path / lost / "summary.json").exists()
    written = {path.name for path in (tmp_path / "tune" / "tn").iterdir()}
    assert written == {"fedavg.yaml", "fedprox.yaml", "results.json", "results.md"}
    table = (tmp_path / "tune" / "tn" / "results.md").read_text()
    assert "Budget: 2 trials x 1 seed(s) (0) x 1 rounds per method" in table and "| fedprox | lr loguniform" in table
    assert all(row["final_runs"] == 2 and row["test_low"] is not None for row in again["methods"])
