"""fedsim/metrics/logger.py: what selects a round reads validation where a run has it (best round, time to accuracy),
and a best round picked on test says so."""
from fedsim.config import validate
from fedsim.core.protocol import RoundResult
from fedsim.metrics.logger import best_rounds, round_row, system_summary
from fedsim.metrics.summary import summarize


def _rows(test: list[float], val: list[float] | None = None) -> list[dict]:
    """rounds.jsonl's evaluated rows, one per round, each accuracy the same at its two clients."""
    rows = []
    for r, acc in enumerate(test, start=1):
        row = {"round": r, "acc": summarize([acc, acc]), "sim_time_s": 10.0 * r, "sampled": 2, "dropouts": [],
               "late": [], "participants": [0, 1]}
        if val is not None:
            row["validation_acc"] = summarize([val[r - 1]] * 2)
        rows.append(row)
    return rows


def test_the_best_round_is_picked_on_validation_and_reports_test_there():
    best = best_rounds(_rows([0.5, 0.7, 0.6], val=[0.6, 0.55, 0.65]))["acc"]
    assert best["round"] == 3 and best["picked_on"] == "validation"
    assert best["mean"] == 0.6 and best["validation"]["mean"] == 0.65  # test at the round validation picked


def test_without_validation_the_best_round_is_the_best_on_test_and_labelled_so():
    best = best_rounds(_rows([0.5, 0.7, 0.6]))["acc"]
    assert best["round"] == 2 and best["mean"] == 0.7 and best["picked_on"] == "test" and "validation" not in best


def test_time_to_accuracy_reads_validation():
    cfg = validate({"system": {"devices": {"preset": "uniform"}, "target_accuracy": [0.6]}})
    records = [{"client": c, "round": 3, "acc": 0.6, "times_sampled": 3} for c in (0, 1)]
    on_val = system_summary(cfg, _rows([0.5, 0.7, 0.6], val=[0.55, 0.58, 0.65]), records, ("mid-range",) * 2)
    assert on_val["time_to_accuracy"]["acc"] == {"0.6": 30.0} and on_val["time_to_accuracy_on"] == "validation"
    on_test = system_summary(cfg, _rows([0.5, 0.7, 0.6]), records, ("mid-range",) * 2)
    assert on_test["time_to_accuracy"]["acc"] == {"0.6": 20.0} and on_test["time_to_accuracy_on"] == "test"


def test_a_rounds_row_summarizes_validation_beside_test():
    records = [{"client": c, "acc": 0.5, "validation_acc": 0.25 * (c + 1), "validation_loss": 1.0} for c in (0, 1)]
    row = round_row(RoundResult(round=1, sampled=[0, 1], dropped=[], records=records))
    assert row["acc"]["mean"] == 0.5 and row["validation_acc"]["mean"] == 0.375
    assert "validation_loss" not in row  # fedsim's own column, not a module's self.log value


def test_a_modules_own_val_acc_scored_on_test_is_never_selected_on():
    """Lightning modules log val_acc in validation_step, which fedsim runs on the test data: not a validation split."""
    rows = _rows([0.5, 0.7, 0.6])
    for row, logged in zip(rows, (0.9, 0.1, 0.2)):
        row["val_acc"] = summarize([logged] * 2)
    best = best_rounds(rows)["acc"]
    assert best["round"] == 2 and best["picked_on"] == "test"


def test_a_rounds_row_keeps_the_dp_mechanism_and_wandb_plots_it():
    from fedsim.metrics.series import round_metrics

    privacy = {"clip_norm": 0.5, "clipped_fraction": 0.25, "update_norm_mean": 0.4, "noise_std": 0.5}
    row = round_row(RoundResult(round=1, sampled=[0, 1], dropped=[], privacy=privacy))
    assert row["privacy"] == privacy
    assert round_metrics(row)["privacy/clipped_fraction"] == 0.25
    assert "privacy" not in round_row(RoundResult(round=1, sampled=[0, 1], dropped=[]))


def test_a_rounds_row_records_the_epsilon_spent_by_its_end():
    row = round_row(RoundResult(round=3, sampled=[], dropped=[], spent={"privacy/epsilon": 0.42}))
    assert row["privacy/epsilon"] == 0.42 and row["sampled"] == 0  # an empty Poisson round still spends
