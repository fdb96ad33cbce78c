"""fedsim/config/execution.py: the engine, system (virtual clock) and logging sections."""
import pytest

from fedsim.config import SystemConfig, validate
from fedsim.errors import ConfigError


def test_packed_training_on_a_cpu_needs_one_thread():
    with pytest.raises(ConfigError, match=r"^engine.pack: packed training on a CPU needs engine.threads_per_worker: "
                       r"1 \(it is 2\)"):
        validate({"engine": {"pack": 2, "threads_per_worker": 2}})
    assert validate({"engine": {"pack": 2, "threads_per_worker": 2, "gpus_per_worker": 0.5}}).engine.pack == 2
    assert validate({"engine": {"pack": "auto"}}).engine.pack == "auto"
    with pytest.raises(ConfigError, match="engine.pack: 0 is not a pack size"):
        validate({"engine": {"pack": 0}})


@pytest.mark.parametrize("system, message", [
    ({"dropout": 0.1}, "system.dropout: needs the virtual clock; set system.devices (e.g. system.devices.preset=uniform)"),
    ({"mode": "async"}, "system.devices: needed with system.mode=async; set system.devices (the virtual clock)"),
    ({"devices": {}, "mode": "async", "deadline_s": 5}, "system.deadline_s: a sync round setting with "
                                                          "system.mode=async; leave it unset"),
    ({"devices": {}, "availability": {"pattern": "trace"}}, "system.availability: pattern trace and a trace file go "
                                                             "together; set both (pattern: trace, trace: FILE.csv) or neither"),
    ({"devices": {}, "target_accuracy": [70]}, "system.target_accuracy: give accuracies between 0 and 1 (e.g. [0.5, 0.7])"),
])
def test_timed_settings_need_the_clock(system, message):
    with pytest.raises(ConfigError) as err:
        validate({"system": system})
    assert str(err.value) == message


def test_the_system_is_off_by_default():
    assert SystemConfig().devices is None and validate({}).system == SystemConfig()
