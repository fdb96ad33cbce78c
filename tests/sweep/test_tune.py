"""`fedsim tune`: the same budget and shared draws for every method, its own declared parameters beside them, a choice
read from validation scores only (test poisoned, choice unchanged), resumable after a lost run folder."""
import json
import shutil

import pytest

from conftest import tune_tree
from fedsim.algorithms import ALGORITHMS
from fedsim.errors import TuningIncomplete
from fedsim.sweep.tune import Choice, choose, plan_tuning, run_tuning, second_stage, selection_key, validation_part


def test_every_method_runs_the_same_first_stage_at_its_own_defaults(tmp_path):
    plan = plan_tuning(tune_tree(tmp_path))
    assert [m.method for m in plan.methods] == ["fedavg", "fedprox", "ditto"]
    for method in plan.methods:
        assert len(method.runs) == method.first == 3 and all([c.seed for c in trial] == [0, 1] for trial in method.runs)
        assert {c.train.rounds for trial in method.runs for c in trial} == {1}
        assert all(c.algorithm.name == method.method for trial in method.runs for c in trial)
    shared = [m.trials for m in plan.methods]
    assert shared[0] == shared[1] == shared[2] and len({t["lr"] for t in shared[0]}) == 3  # paired, and drawn
    fedavg, fedprox, ditto = plan.methods
    assert fedavg.own == {} and set(fedprox.own) == {"algorithm.mu"}
    default_mu = ALGORITHMS["fedprox"].Params().mu  # the authors' setting is always a candidate
    assert {c.algorithm.params["mu"] for trial in fedprox.runs for c in trial} == {default_mu}
    run = fedprox.runs[1][0]
    assert run.train.body.lr == run.train.head.lr == fedprox.trials[1]["lr"]
    again = plan_tuning(tune_tree(tmp_path))
    assert [c.name for c in again.search_runs] == [c.name for c in plan.search_runs]
    assert plan_tuning({**tune_tree(tmp_path), "seed": 4}).methods[0].trials != fedavg.trials  # from the seed


def test_the_second_stage_searches_a_methods_own_parameters_at_its_first_choice(tmp_path):
    plan = plan_tuning(tune_tree(tmp_path, own_trials=2))
    fedavg, fedprox, _ = plan.methods
    second = second_stage(plan, fedprox, Choice(trial=2, score=0.5, failed=[]))
    added = second.trials[second.first:]
    assert len(added) == 2 and len(second.runs) == 5
    assert all({k: t[k] for k in ("lr", "momentum")} == fedprox.trials[2] for t in added)  # at the choice
    assert [c.name for c in second.runs[3]] == [f"{plan.base.name}-fedprox-o0-s{seed}" for seed in (0, 1)]
    assert {second.runs[3][0].algorithm.params["mu"], second.runs[4][0].algorithm.params["mu"]} == {
        t["algorithm.mu"] for t in added}
    refined = second_stage(plan, fedavg, Choice(trial=0, score=0.5, failed=[]))  # no own parameters: the step
    lr = fedavg.trials[0]["lr"]
    assert [t["lr"] for t in refined.trials[3:]] == pytest.approx([lr / 2 ** 0.5, lr * 2 ** 0.5], rel=1e-5)


def test_a_parameter_the_config_fixes_is_not_searched(tmp_path):
    plan = plan_tuning(tune_tree(tmp_path, methods=[{"name": "fedprox", "mu": 0.5}]))
    assert plan.methods[0].own == {}
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
    searched = sorted(tmp_path.glob("tn-*-[to][0-9]-s*"))  # both stages' runs
    assert len(searched) == 2 * (2 + 2)  # 2 methods x (2 shared + 2 own trials) x 1 seed
    for folder in searched:
        path = folder / "summary.json"
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
    assert "Budget: stage 1: 2 draws of the shared space, each method at its own defaults (2 trials); stage 2: 2" in table
    assert "| fedprox | algorithm.mu choice [0.001, 0.01, 0.1, 1.0] |" in table and "| fedavg | - |" in table
    assert all(row["final_runs"] == 2 and row["test_low"] is not None for row in again["methods"])
