"""fedsim/config/learning.py: the data and its partition, model, training, server rule and evaluation sections."""
import pytest

from fedsim.config import OptimConfig, validate
from fedsim.errors import ConfigError


def test_a_partition_is_a_name_or_a_name_with_its_own_settings():
    assert validate({"data": {"partition": "classes"}}).data.partition.arguments() == {"k": 4}
    dirichlet = validate({"data": {"partition": {"name": "dirichlet", "beta": 0.3}}}).data.partition
    assert dirichlet.arguments() == {"beta": 0.3}
    # The flat keys of before move into the partition they belong to and are ignored by another kind.
    assert validate({"data": {"partition": "shards", "shards_per_client": 2}}).data.partition.arguments() == {
        "shards_per_client": 2, "shard_style": "fedbabu"}
    assert validate({"data": {"partition": "iid", "beta": 0.5}}).data.partition.arguments() == {}


@pytest.mark.parametrize("data, message", [
    ({"partition": {"name": "dirichlet", "beta": 0.3}, "beta": 0.5},
     "data.beta: given twice, also as data.partition.beta; keep data.partition.beta"),
    ({"partition": "zzz"}, "data.partition.name: unknown partition 'zzz'; choose one of iid, classes, shards, "
                           "dirichlet, conflicting, natural or give 'package.module:function' (got 'zzz')"),
    ({"partition": {"name": "iid", "k": 3}}, "data.partition.k: Extra inputs are not permitted (got 3)"),
])
def test_a_wrong_partition_is_named(data, message):
    with pytest.raises(ConfigError) as err:
        validate({"data": data})
    assert str(err.value) == message


def test_a_step_schedule_drops_the_rate_at_each_milestone():
    step = OptimConfig(lr=1.0, schedule="step", milestones=[0.5, 0.75], gamma=0.1)
    assert [step.lr_at(r, 8) for r in range(1, 9)] == pytest.approx([1, 1, 1, 1, 0.1, 0.1, 0.01, 0.01])
    assert step.scale_at(8, 8) == pytest.approx(0.01) and OptimConfig(lr=0.3).lr_at(8, 8) == 0.3


def test_evaluation_settings_agree_with_how_it_personalizes():
    assert validate({"eval": {"personalize": "own_update"}}).eval.personalizes
    assert not validate({"eval": {"finetune_epochs": 0}}).eval.personalizes
    with pytest.raises(ConfigError, match=r"^eval.finetune_lr: not used with eval.personalize: own_update"):
        validate({"eval": {"personalize": "own_update", "finetune_lr": 0.1}})
    with pytest.raises(ConfigError, match=r"^eval.unseen: a fraction must be at most 1.0, got 1.5"):
        validate({"eval": {"unseen": 1.5}})


def test_the_precision_may_be_written_as_a_number():
    assert validate({"model": {"precision": 32}}).model.precision == "32"
