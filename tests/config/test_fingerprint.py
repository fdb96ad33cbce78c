"""fedsim/config/fingerprint.py: which settings change results, and the fingerprint a resume must match (settings
added later leave an older run's fingerprint as it was while they sit at their legacy defaults)."""
import pytest

from fedsim.config import changed_settings, result_settings, resume_fingerprint, validate

BASE = {"algorithm": "fedavg", "train": {"rounds": 4}}


def dump(**over) -> dict:
    return validate({**BASE, **over}).model_dump()


def written_before(cfg_dict: dict, section: str, *keys: str) -> dict:
    """``cfg_dict`` as an older fedsim wrote it: without the given keys (or the whole section)."""
    old = {k: (dict(v) if isinstance(v, dict) else v) for k, v in cfg_dict.items()}
    if not keys:
        del old[section]
    for key in keys:
        del old[section][key]
    return old


@pytest.mark.parametrize("section, keys, changed_value", [
    ("eval", ("unseen", "personalize"), {"eval": {"unseen": 2}}),
    ("model", ("precision", "client_loop", "head"), {"model": {"client_loop": "trainer"}}),
    ("model", ("options",), {"model": {"name": "char_lstm", "options": {"hidden": 64}}}),
    ("server", (), {"server": {"aggregator": "median"}}),
    ("data", ("validation",), {"data": {"validation": 0.2}}),
])
def test_a_later_key_at_its_legacy_default_keeps_the_fingerprint(section, keys, changed_value):
    now = dump()
    assert resume_fingerprint(written_before(now, section, *keys)) == resume_fingerprint(now)
    other = dump(**changed_value)
    assert resume_fingerprint(other) != resume_fingerprint(now)
    assert changed_settings(now, other) and all(k.startswith(f"{section}.") for k in changed_settings(now, other))


def test_fingerprints_are_pinned_as_checkpoints_hold_them():
    """Values written into checkpoints (by fedsim before this package): a later-added section at its default (the
    ideal federation of ``system``, the exact mean of ``server``) leaves them as they were."""
    assert resume_fingerprint(dump()) == "09820e7b4fd49a4a"
    assert resume_fingerprint(dump(data={"partition": {"name": "conflicting"}})) == "ef2214f17ffc9b7e"
    assert resume_fingerprint(dump(system={"devices": {"preset": "uniform"}})) == "6daafe0a579bb2f6"


def test_a_later_partition_setting_is_fingerprinted_only_off_its_default():
    at_default = dump(data={"partition": {"name": "conflicting"}})
    assert resume_fingerprint(dump(data={"partition": {"name": "conflicting", "agreed": 0.0}})) == \
        resume_fingerprint(at_default)
    agreed = dump(data={"partition": {"name": "conflicting", "agreed": 0.5}})
    assert changed_settings(at_default, agreed) == ["data.partition.agreed"]


def test_where_a_run_writes_and_how_it_logs_never_change_results():
    now = dump()
    settings = result_settings(now)
    assert not settings.keys() & {"name", "out_dir", "sweep", "search", "logging"}
    assert settings["engine"] == {"threads_per_worker": 1, "memory_format": "auto", "packed": False}
    moved = dump(name="elsewhere", out_dir="/tmp/x", engine={"workers": 7}, logging={"wandb": {"mode": "offline"}})
    assert resume_fingerprint(moved) == resume_fingerprint(now) and changed_settings(now, moved) == []
    assert changed_settings(now, dump(engine={"pack": 4})) == ["engine.packed"]


def test_a_resume_may_extend_the_rounds_unless_a_step_schedule_places_milestones_by_them():
    assert changed_settings(dump(), dump(train={"rounds": 9})) == []
    step = {"body": {"schedule": "step"}}
    assert changed_settings(dump(train={"rounds": 4, **step}), dump(train={"rounds": 9, **step})) == ["train.rounds"]


def test_a_resume_may_not_extend_the_rounds_a_calibrated_noise_multiplier_was_computed_for():
    calibrated = {"target_epsilon": 4.0}
    uniform = {"weighting": "uniform"}
    assert changed_settings(dump(privacy=calibrated, train=uniform),
                            dump(privacy=calibrated, train={**uniform, "rounds": 9})) == ["train.rounds"]
    given = {"noise_multiplier": 1.0, "target_epsilon": 40.0}  # the budget is checked again at the new round count
    assert changed_settings(dump(privacy=given, train=uniform), dump(privacy=given, train={**uniform, "rounds": 9})) == []
