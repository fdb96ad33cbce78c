"""fedsim/config/loading.py: a config file read strictly, overrides set as dotted keys and merged, the tree
validated; every refusal one line naming the key or the file."""
import pytest

from conftest import write_yaml

from fedsim.config import load_tree, merge_trees, parse_overrides, refuse_defaults_only, set_dotted, validate
from fedsim.errors import ConfigError

FILE = {"algorithm": "fedprox", "train": {"rounds": 7, "body": {"lr": 0.1, "momentum": 0.5}}}


def test_an_override_of_a_nested_key_keeps_its_siblings(tmp_path):
    path = write_yaml(tmp_path / "exp.yaml", FILE)
    cfg = validate(load_tree(path, ["train.body.lr=0.05", "algorithm.mu=0.3"]))
    assert (cfg.train.body.lr, cfg.train.body.momentum, cfg.train.rounds) == (0.05, 0.5, 7)
    assert cfg.train.head.lr == 0.01  # the other part keeps its default
    assert cfg.algorithm.name == "fedprox" and cfg.algorithm.params == {"mu": 0.3}
    assert cfg.name == "exp"  # the file's stem unless it names the run


def test_overrides_are_yaml_scalars_and_a_sweeps_keys_stay_dotted():
    assert parse_overrides(["train.rounds=3", "data.partition=iid", "eval.clients=0.5", "sweep.train.body.lr=[0.1, 1]"]) == {
        "train": {"rounds": 3}, "data": {"partition": "iid"}, "eval": {"clients": 0.5},
        "sweep": {"train.body.lr": [0.1, 1]}}


@pytest.mark.parametrize("pair, message", [
    ("train.rounds", "override 'train.rounds': expected key=value, e.g. train.rounds=3"),
    ("=3", "override '=3': expected key=value, e.g. train.rounds=3"),
])
def test_a_malformed_override_is_refused(pair, message):
    with pytest.raises(ConfigError) as err:
        parse_overrides([pair])
    assert str(err.value) == message


def test_set_dotted_makes_sections_and_refuses_to_go_through_a_value():
    tree = {"algorithm": "fedprox"}
    set_dotted(tree, "algorithm.mu", 0.1)
    set_dotted(tree, "train.body.lr", 0.2)
    assert tree == {"algorithm": {"name": "fedprox", "mu": 0.1}, "train": {"body": {"lr": 0.2}}}
    with pytest.raises(ConfigError, match=r"^train.body.lr.x: lr is not a section; check the key$"):
        set_dotted(tree, "train.body.lr.x", 1)


def test_merge_trees_merges_section_by_section_and_changes_neither():
    base, extra = {"train": {"rounds": 3, "body": {"lr": 1}}, "seed": 1}, {"train": {"body": {"momentum": 0}}}
    assert merge_trees(base, extra) == {"train": {"rounds": 3, "body": {"lr": 1, "momentum": 0}}, "seed": 1}
    assert base == {"train": {"rounds": 3, "body": {"lr": 1}}, "seed": 1} and extra == {"train": {"body": {"momentum": 0}}}


@pytest.mark.parametrize("text, message", [
    ("", "the file is empty"),
    ("- a\n- b\n", "the top level must be a mapping of sections"),
    ("train: {rounds: 3\n", "not valid YAML"),
])
def test_an_unusable_file_is_named(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{path}: {message}"):
        load_tree(path)
    with pytest.raises(ConfigError, match="config file not found"):
        load_tree(tmp_path / "absent.yaml")


def test_a_moved_key_and_a_defaults_only_file_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^train.mu: moved to the method's own parameters; write algorithm: "
                       r"\{name: fedprox, mu: ...\}$"):
        validate({"train": {"mu": 0.1}})
    with pytest.raises(ConfigError, match="sets none of algorithm, data, eval, model, sweep, train"):
        refuse_defaults_only("c.yaml", {"engine": {"workers": 1}})
    refuse_defaults_only("c.yaml", {"data": {"num_clients": 4}})
