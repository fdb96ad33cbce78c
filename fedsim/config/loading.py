"""A run's config from its YAML file and ``key=value`` overrides: the file read strictly (:func:`load_tree`), the
overrides set as dotted keys (:func:`parse_overrides`, :func:`set_dotted`) and merged (:func:`merge_trees`), and
the tree validated into a :class:`RunConfig` whose sections agree (:func:`validate`)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedsim import strict_yaml
from fedsim.config.base import format_error
from fedsim.config.checks import check_sections
from fedsim.config.schema import MOVED_KEYS, RunConfig
from fedsim.errors import ConfigError, YamlError


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """``tree[a][b][c] = value`` for ``dotted`` "a.b.c", making the sections on the way."""
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        if key in ("algorithm", "partition") and isinstance(node.get(key), str):  # `algorithm: fedprox` + `algorithm.mu=0.1`
            node[key] = {"name": node[key]}
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {key} is not a section; check the key")
    node[leaf] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["train.rounds=3", "algorithm=fedavg"]`` -> nested dict (values parsed as YAML scalars)."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r}: expected key=value, e.g. train.rounds=3")
        try:
            value = strict_yaml.load(raw)
        except YamlError as err:
            raise ConfigError(f"override {key.strip()}: {err}") from None
        key = key.strip()
        if key.startswith("sweep.") and len(key) > len("sweep."):  # a sweep's keys are dotted settings themselves
            tree.setdefault("sweep", {})[key[len("sweep."):]] = value
        else:
            set_dotted(tree, key, value)
    return tree


def merge_trees(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra``'s values set over it, section by section (neither is changed)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge_trees(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _refuse_moved_keys(tree: dict[str, Any]) -> None:
    for (section, key), now in MOVED_KEYS.items():
        if isinstance(tree.get(section), dict) and key in tree[section]:
            raise ConfigError(f"{section}.{key}: moved to the method's own parameters; write {now}")


def validate(tree: dict[str, Any]) -> RunConfig:
    """The tree as a :class:`RunConfig`: each section valid, then the rules that tie sections together
    (:func:`check_sections`), so an invalid run is refused before any data loads."""
    _refuse_moved_keys(tree)
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(format_error(err, model=RunConfig)) from None
    check_sections(cfg)
    return cfg


RUN_SECTIONS = {"algorithm", "data", "model", "train", "eval", "sweep"}  # what a config sets to describe a run


def refuse_defaults_only(path: str | Path, tree: dict[str, Any]) -> None:
    """A valid config that sets none of the sections describing a run would train every default (a whole
    CIFAR-10 run): most likely the wrong file. Checked after validation, so a bad value is named first."""
    if not tree.keys() & RUN_SECTIONS:
        raise ConfigError(f"{path}: sets none of {', '.join(sorted(RUN_SECTIONS))}, so it would run every default "
                          "(a whole CIFAR-10 training); name at least the data and the method")


def load_tree(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The YAML file at ``path`` with ``overrides`` (``key=value``) merged over it, not yet validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; pass the path of a YAML file such as experiments/quickstart.yaml")
    try:
        text = strict_yaml.read_text(path)
    except YamlError as err:
        raise ConfigError(f"{path}: {err}") from None
    try:
        tree = strict_yaml.load(text)
    except YamlError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}); fix the syntax") from None
    if tree is None:
        raise ConfigError(f"{path}: the file is empty; a config names at least its data and method (start from "
                          "experiments/quickstart.yaml)")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (data:, model:, train:, ...)")
    tree.setdefault("name", path.stem)
    if isinstance(tree.get("algorithm"), str):  # so that `algorithm.mu=...` overrides keep the name
        tree["algorithm"] = {"name": tree["algorithm"]}
    return merge_trees(tree, parse_overrides(list(overrides)))
