"""fedsim/config/schema.py: RunConfig as a whole: the run's name and where it writes, the method by name, and the
sweep / search sections (a value list or a distribution per key) and tune (fedsim tune's budget and space)."""
import pytest

from fedsim.config import Distribution, RunConfig, validate
from fedsim.errors import ConfigError


def test_every_section_has_its_defaults_and_the_dump_validates_back():
    cfg = validate({})
    assert (cfg.name, cfg.seed, cfg.algorithm.name, cfg.data.dataset, cfg.model.name) == ("run", 0, "fedper", "cifar10",
                                                                                       "cnn4")
    assert validate(cfg.model_dump()) == cfg and isinstance(cfg, RunConfig)


@pytest.mark.parametrize("name", ["../escape", "a b", "/abs", "-x", "x" * 129])
def test_the_name_is_one_safe_folder(name):
    with pytest.raises(ConfigError, match="^name: must be one folder name"):
        validate({"name": name})


@pytest.mark.parametrize("out_dir, kept", [("runs", "runs"), ("file:///data/runs", "/data/runs"),
                                           ("s3://bucket/runs", "s3://bucket/runs"), ("C:/runs", "C:/runs")])
def test_out_dir_is_a_folder_or_a_reachable_store(out_dir, kept):
    assert validate({"out_dir": out_dir}).out_dir == kept


@pytest.mark.parametrize("out_dir, message", [
    ("ftp://host/x", "names the ftp:// scheme"), ("s3:bucket", "names no bucket"), ("s3:///x", "names no bucket")])
def test_a_mistyped_store_is_refused(out_dir, message):
    with pytest.raises(ConfigError, match=f"^out_dir: .*{message}"):
        validate({"out_dir": out_dir})


def test_the_method_is_a_name_or_a_name_with_its_parameters():
    assert validate({"algorithm": "ditto"}).algorithm.name == "ditto"
    assert validate({"algorithm": {"name": "fedprox", "mu": 0.5}}).algorithm.params == {"mu": 0.5}


def test_a_sweep_key_holds_a_list_or_one_distribution():
    sweep = validate({"sweep": {"seed": [0, 1], "train.body.lr": {"loguniform": [0.001, 0.1]}}}).sweep
    assert sweep["seed"] == [0, 1]
    assert isinstance(sweep["train.body.lr"], Distribution)
    assert (sweep["train.body.lr"].kind, sweep["train.body.lr"].bounds) == ("loguniform", (0.001, 0.1))


@pytest.mark.parametrize("value, message", [
    (3, r"sweep.seed: give a list of values or a distribution"),
    ({"uniform": [1, 2], "choice": [1]}, r"sweep.seed: config: give exactly one of uniform, loguniform, randint, choice "
                                         r"\(got uniform, choice\)"),
    ({"uniform": [2, 1]}, r"sweep.seed: uniform: \[lo, hi\] needs lo < hi \(got \[2.0, 1.0\]\)"),
    ({"loguniform": [0, 1]}, r"sweep.seed: loguniform: lo must be above 0 \(got 0.0\)"),
    ({"choice": []}, r"sweep.seed: choice: give at least one value"),
])
def test_a_wrong_sweep_value_is_named(value, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        validate({"sweep": {"seed": value}})


def test_tune_holds_the_budget_and_the_shared_space_with_their_defaults():
    cfg = validate({"data": {"validation": 0.1}, "tune": {"methods": ["fedavg", {"name": "fedprox", "mu": 0.1}]}})
    tune = cfg.tune
    assert (tune.trials, tune.rounds, tune.seeds, tune.final_seeds) == (8, None, [0], 5)
    assert [m.name for m in tune.methods] == ["fedavg", "fedprox"] and tune.methods[1].params == {"mu": 0.1}
    assert {key: dist.kind for key, dist in tune.space.items()} == {"lr": "loguniform", "momentum": "choice",
                                                                   "local_epochs": "choice"}
    assert validate(cfg.model_dump()) == cfg and validate({}).tune is None
    with pytest.raises(ConfigError, match=r"^tune.trials: "):
        validate({"data": {"validation": 0.1}, "tune": {"methods": ["fedavg"], "trials": 0}})
