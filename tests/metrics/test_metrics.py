import math

import numpy as np
import pytest

from fedsim.metrics import summarize


def test_keys_and_population_std():
    s = summarize([2, 4, 4, 4, 5, 5, 7, 9])  # textbook case: population std 2, sample std would be 2.14
    assert set(s) == {"mean", "std", "min", "max", "p10", "worst10_mean", "jain"}
    assert (s["mean"], s["std"], s["min"], s["max"]) == (5.0, 2.0, 2.0, 9.0)


def test_p10_is_linear_interpolation():
    # position 0.1 * (5 - 1) = 0.4 between 0 and 10
    assert summarize([40, 0, 30, 10, 20])["p10"] == pytest.approx(4.0)
    assert summarize([0.3])["p10"] == pytest.approx(0.3)


@pytest.mark.parametrize(("n", "expected"), [(20, 1.5), (7, 1.0), (30, 2.0), (1, 1.0)])
def test_worst10_mean_takes_ceil_ten_percent(n, expected):
    # values n..1 (unsorted input): 20 clients -> worst 2 (1, 2); 7 -> worst 1;
    # 30 -> worst 3, not 4 (0.1 * 30 is just above 3 in floats)
    values = [float(v) for v in range(n, 0, -1)]
    assert summarize(values)["worst10_mean"] == pytest.approx(expected)


def test_jain_index():
    assert summarize([0.5, 0.5, 0.5, 0.5])["jain"] == pytest.approx(1.0)
    assert summarize([1.0, 0.0, 0.0, 0.0])["jain"] == pytest.approx(0.25)  # one client has everything: 1/n
    assert summarize([1.0, 2.0, 3.0])["jain"] == pytest.approx(36 / 42)  # (1+2+3)^2 / (3 * (1+4+9))
    assert summarize([0.0, 0.0])["jain"] == 1.0


def test_empty_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_all_values_are_plain_floats():
    # The engine writes these dicts to rounds.jsonl and summary.json.
    assert all(isinstance(v, float) and math.isfinite(v) for v in summarize([0.1, 0.7, 0.4]).values())


def test_a_lower_is_better_metrics_worst_clients_are_its_highest_values():
    losses = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 5.0]
    s = summarize(losses, lower_is_better=True)
    assert s["worst10_mean"] == pytest.approx((5.0 + 1.0) / 2)  # ceil(1.1) = 2 worst: the two highest losses
    assert s["p10"] == pytest.approx(float(np.percentile(losses, 90)))  # the boundary of the worst 10%
    assert (s["min"], s["max"]) == (0.1, 5.0)
    assert s["jain"] == summarize(losses)["jain"]  # equality has no direction


def test_logged_losses_are_summarized_lower_is_better_in_rows_and_the_report():
    from fedsim.core.protocol import RoundResult
    from fedsim.metrics.logger import round_row
    from fedsim.metrics.report_tables import logged_table

    records = [{"client": c, "round": 1, "acc": 0.5, "val_loss": loss, "f1": f1}
               for c, (loss, f1) in enumerate([(0.2, 0.9), (0.4, 0.8), (3.0, 0.1)])]
    row = round_row(RoundResult(round=1, sampled=[0, 1, 2], dropped=[], records=records))
    assert row["val_loss"]["worst10_mean"] == 3.0 and row["f1"]["worst10_mean"] == pytest.approx(0.1)

    class Run:
        name, logged = "r", {"val_loss": [0.2, 0.4, 3.0]}

    cells = logged_table([Run()])[2].split(" | ")
    assert cells[1:3] == ["val_loss", "3"] and cells[6:8] == ["2.48", "3"]  # p10 and worst10: toward the highest loss


@pytest.mark.parametrize("name, lower", [("loss", True), ("train_loss", True), ("val/error", True), ("test_mse", True),
                                         ("acc", False), ("f1", False), ("glossary_acc", False), ("val_acc", False)])
def test_metric_direction_from_its_name(name, lower):
    from fedsim.core.protocol import lower_is_better

    assert lower_is_better(name) is lower


@pytest.mark.parametrize("name, mode", [("fairness/acc_p10", "max"), ("fairness/acc_personalized_worst10_mean", "max"),
                                        ("fairness/acc_std", "min"), ("val_loss/mean", "min"), ("val_loss/jain", "max"),
                                        ("val_acc/p10", "max"), ("comm/bytes_up", "min"), ("round_seconds", "min")])
def test_a_series_direction(name, mode):
    from fedsim.metrics.series import series_mode

    assert series_mode(name) == mode
