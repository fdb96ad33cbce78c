"""YAML for configs, without the surprises of PyYAML's YAML 1.1 defaults.

- Booleans are only ``true``/``false`` (YAML 1.2): ``checkpoint_every: no`` stays the string 'no', which
  the config then rejects, instead of becoming False and then 0 (checkpoints silently off).
- Integers are decimal (or 0x/0o): ``010`` is 10, not 8, and ``1:30`` is not 90. Floats may omit the dot
  (``1e-3``).
- A key given twice in one mapping is an error naming it; PyYAML silently keeps the last, which for a
  section replaces the whole first one.
- Anchors and aliases still work, but a document that expands past a node budget (an "alias bomb",
  a few hundred bytes that expand to billions of nodes) or a file past a size limit is refused, and
  the error never echoes the input back.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from fedsim import safe_files
from fedsim.errors import YamlError

MAX_BYTES = 1 << 20  # a config is a few kB; a megabyte is already far past any real one
MAX_INT_DIGITS = 1000  # no setting takes a number past 64 bits (20 digits); Python refuses to parse past 4,300
MAX_NODES = 100_000  # nodes after alias expansion (sweeps over hundreds of values stay far below)


def _resolvers() -> dict[str, list[tuple[str, re.Pattern]]]:
    kept = {first: [(tag, rx) for tag, rx in entries if tag not in (BOOL, INT, FLOAT)]
            for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for tag, rx, firsts in ((BOOL, _BOOL, "tTfF"), (INT, _INT, "-+0123456789"), (FLOAT, _FLOAT, "-+.0123456789")):
        for first in firsts:
            kept.setdefault(first, []).append((tag, rx))
    return kept


BOOL, INT, FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


# libyaml's parser where PyYAML was built with it: the pure-Python one spent 40 ms per run config (a leaderboard page
# reads ~850 of them: 34 of its 45 s). Only scanning and parsing move to C: the resolvers and constructors below stay
# these Python ones, and libyaml refuses nesting past 1,000 levels itself (a ScannerError, reported as YamlError).
_Base: type = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _StrictLoader(_Base):
    yaml_implicit_resolvers = _resolvers()

    # Registered below for the bool and int tags, which only scalar nodes carry.
    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        return self.construct_scalar(node).lower() == "true"

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = self.construct_scalar(node)
        _refuse_long_integer(None, node)  # one in a mapping was refused naming its key
        return int(text[2:], 8) if text.startswith("0o") else int(text, 16 if text.startswith("0x") else 10)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):  # `? [a, b]`: no setting is named so (PyYAML would fail unhashable)
                kind = "list" if isinstance(key, list) else "mapping"
                raise YamlError(f"line {key_node.start_mark.line + 1}: a key is a {kind}; a key names a setting: "
                                "write it as text")
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise YamlError(f"line {key_node.start_mark.line + 1}: key {str(key)[:60]!r} is given twice in one "
                                "mapping; keep one (a repeated section would replace the first one whole)")
            seen.add(key)
            _refuse_long_integer(key, value_node)
        return super().construct_mapping(node, deep=deep)


def _refuse_long_integer(key: Any, node: yaml.Node) -> None:
    """An integer past MAX_INT_DIGITS under ``key``: one line naming the key (Python's own refusal, past 4,300 digits,
    names no setting; a shorter one reaches the setting's bounds, which name it)."""
    if node.tag == INT and isinstance(node.value, str) and len(node.value) > MAX_INT_DIGITS:
        named = "" if key is None else f"{str(key)[:60]}: "
        raise YamlError(f"line {node.start_mark.line + 1}: {named}an integer of {len(node.value):,} digits, "
                        "past any setting's range; give a number such as 1e9")


_StrictLoader.add_constructor(BOOL, _StrictLoader.construct_yaml_bool)
_StrictLoader.add_constructor(INT, _StrictLoader.construct_yaml_int)


def _check_expanded_size(value: Any) -> None:
    """Count nodes as a consumer walking the data would see them (aliases counted every time they are
    reached); stop as soon as the budget is spent, so the check itself stays cheap."""
    budget, stack = MAX_NODES, [value]
    while stack:
        budget -= 1
        if budget < 0:
            raise YamlError(f"expands to more than {MAX_NODES:,} values through anchors and aliases; "
                            "write the values out instead of nesting aliases")
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def read_text(path: Path) -> str:
    """The text of the YAML file at ``path``, read no further than the size limit; YamlError (saying the fix) for a
    file past it or one that is not UTF-8 text."""
    with safe_files.open_regular(path, follow_links=True) as handle:  # a FIFO would block the read forever
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlError(f"larger than {MAX_BYTES >> 20} MiB; a config is a few kB, check the file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YamlError(f"not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save the file as "
                        "UTF-8") from None


def load(text: str) -> Any:
    """Parse one YAML document under the rules above; raises YamlError (one line)."""
    if len(text.encode()) > MAX_BYTES:
        raise YamlError(f"larger than {MAX_BYTES >> 20} MiB; a config is a few kB, check the file")
    try:
        value = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise YamlError(f"{where}{getattr(err, 'problem', None) or 'not valid YAML'}") from None
    except RecursionError:
        raise YamlError("nested too deeply; flatten the file") from None
    _check_expanded_size(value)
    return value
