"""fedsim/config/base.py: what every section shares (exactly its keys, no bool/number mix-up, no inf/nan) and the
one line a validation error becomes."""
import pytest
from pydantic import ValidationError

from fedsim.config import TrainConfig, validate
from fedsim.config.base import format_error
from fedsim.errors import ConfigError


@pytest.mark.parametrize("tree, message", [
    ({"train": {"rounds": True}}, "train.rounds: expected a number, not true/false (got True)"),
    ({"data": {"augment": 1}}, "data.augment: expected true or false (got 1)"),
    ({"train": {"roundz": 3}}, "train.roundz: Extra inputs are not permitted (got 3); did you mean rounds?"),
    ({"engine": {"round_timeout_s": float("inf")}}, "engine.round_timeout_s: Input should be a finite number (got inf)"),
])
def test_every_section_is_strict(tree, message):
    with pytest.raises(ConfigError) as err:
        validate(tree)
    assert str(err.value) == message


def test_format_error_names_the_field_and_keeps_a_validators_own_line():
    with pytest.raises(ValidationError) as err:
        TrainConfig.model_validate({"rounds": 0})
    assert format_error(err.value, prefix="train") == "train.rounds: Input should be greater than or equal to 1 (got 0)"
    with pytest.raises(ValidationError) as err:
        TrainConfig.model_validate({"rounds": list(range(1000))})
    assert format_error(err.value).startswith("rounds: Input should be a valid integer (got [0, 1, 2, ...])")
