"""fedsim/metrics/series.py: validation's series beside test's, under W&B's and Tune's names."""
from fedsim.config import validate
from fedsim.metrics.series import metric_names, on_test, round_metrics
from fedsim.metrics.summary import summarize


def test_validation_is_logged_beside_test_and_named_for_a_sweep_that_has_it():
    row = {"round": 2, "bytes_up": 0, "bytes_down": 0, "seconds": 1.0, "acc": summarize([0.5, 0.7]),
           "validation_acc": summarize([0.4, 0.6])}
    logged = round_metrics(row)
    assert logged["fairness/acc_mean"] == 60.0 and logged["fairness/validation_acc_mean"] == 50.0
    assert not any(name.startswith("validation_acc/") for name in logged)  # fedsim's own, not a module's self.log
    assert "fairness/validation_acc_p10" in metric_names(validate({"data": {"validation": 0.1}}))
    assert not any("validation_" in name for name in metric_names(validate({})))


def test_a_test_series_has_a_validation_twin_and_others_have_none():
    assert on_test("fairness/acc_p10") == "fairness/validation_acc_p10"
    assert on_test("fairness/acc_personalized_jain") == "fairness/validation_acc_personalized_jain"
    assert on_test("fairness/validation_acc_p10") is None and on_test("comm/bytes_up") is None


def test_the_epsilon_spent_is_a_series_every_round_and_lower_is_better():
    from fedsim.metrics.series import series_mode

    row = {"round": 2, "bytes_up": 0, "bytes_down": 0, "seconds": 1.0, "privacy/epsilon": 0.5}
    assert round_metrics(row)["privacy/epsilon"] == 0.5 and series_mode("privacy/epsilon") == "min"
    central = {"algorithm": "fedavg", "privacy": {"noise_multiplier": 1.0}}
    assert "privacy/epsilon" in metric_names(validate(central))
    local = {"algorithm": "fedavg", "privacy": {"dp": "local", "noise_multiplier": 1.0}}
    assert {"privacy/epsilon", "privacy/epsilon_median"} <= set(metric_names(validate(local)))
    assert not any(name.startswith("privacy/") for name in metric_names(validate({})))
