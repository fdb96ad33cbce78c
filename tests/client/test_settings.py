"""The one rule that sets a local update's optimizers (fedsim/client/settings.py): fedsim's own optimizers per part
and round, a module's own scaled by the round schedule, and fine-tuning's overrides."""
import pytest
import torch
from conftest import synthetic_tree

from fedsim.client.optimizers import OptimizerSet
from fedsim.client.settings import Hyper, OptimizerSettings
from fedsim.config import validate


def _settings(tmp_path, own: bool, **over) -> OptimizerSettings:
    over = {"train.body": {"lr": 0.1, "momentum": 0.5, "schedule": "step"}, "train.rounds": 4, **over}
    return OptimizerSettings(validate(synthetic_tree(tmp_path, **over)), own)


def _one_group_set(lr: float) -> OptimizerSet:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=0.9)
    return OptimizerSet([opt], [], [opt], [[frozenset({"body"})]])


def test_fedsims_own_optimizers_take_the_parts_schedule_and_finetuning_its_own_sgd(tmp_path):
    s = _settings(tmp_path, own=False, **{"eval.finetune_momentum": 0.0, "eval.finetune_weight_decay": 0.01})
    assert s.sgd("body", 1) == Hyper(0.1, 0.5, 0.0)
    assert s.sgd("body", 4).lr == pytest.approx(0.001)  # x0.1 at 1/2 and 3/4 of the rounds
    assert s.sgd("body", 4, finetune=True) == Hyper(s.sgd("body", 4).lr, 0.0, 0.01)  # the decayed lr, FedBABU's
    groups = s.param_groups({"body": [torch.zeros(1)], "head": [torch.zeros(1)]}, frozenset({"body"}), 1)
    assert [(g["lr"], g["momentum"]) for g in groups] == [(0.1, 0.5)]
    assert s.overrides(_one_group_set(0.7), 4, False) == [[{"lr": s.lr("body", 4)}]]
    tuned = _settings(tmp_path, own=False, **{"eval.finetune_lr": 0.05})
    assert tuned.lr("body", 4, finetune=True) == 0.05 and tuned.sgd("head", 1, finetune=True).lr == 0.05


def test_a_modules_own_optimizers_keep_their_settings_scaled_by_the_round_schedule(tmp_path):
    s = _settings(tmp_path, own=True)
    [[late]] = s.overrides(_one_group_set(0.7), 4, False)
    assert late == {"lr": pytest.approx(0.007)}
    assert s.overrides(_one_group_set(0.7), 4, True) == [[{"lr": late["lr"]}]]  # no finetune_lr: the same rule
    tuned = _settings(tmp_path, own=True, **{"eval.finetune_lr": 0.05})
    assert tuned.overrides(_one_group_set(0.7), 4, True) == [[{"lr": 0.05, "initial_lr": 0.05}]]
