"""What a RunPlan derives from its config and method."""
import pytest
from conftest import synthetic_tree

from fedsim.algorithms import algorithm_class
from fedsim.config import validate
from fedsim.plan import RunPlan


@pytest.mark.parametrize("algorithm, evaluation, reported", [
    ("fedbabu", {"finetune_epochs": 1}, "acc_personalized"),  # FedBABU's protocol: the head tuned at evaluation
    ("fedprox_babu", {"finetune_epochs": 1}, "acc_personalized"),
    ("fedbabu", {"finetune_epochs": 0}, "acc"),  # not measured: the initial one
    ("fedper", {"finetune_epochs": 1}, "acc"),  # the model each client holds
    ("fedrep", {"personalize": "own_update", "finetune_epochs": 5}, "acc_personalized"),
])
def test_the_reported_accuracy_is_the_one_the_methods_protocol_reports(tmp_path, algorithm, evaluation, reported):
    cfg = validate(synthetic_tree(tmp_path, algorithm=algorithm, eval=evaluation))
    plan = RunPlan(cfg, algorithm_class(algorithm)(), None, (), 2, (1, 1, 1))
    assert plan.reported_accuracy == reported
