"""User code named in a config as ``package.module:name`` - an algorithm, model, dataset, partition, client
module or callback - imported without editing fedsim.

A plug-in string runs code: importing its module runs that module. So a string resolves only to user code of
the kind its field expects (a subclass of the field's base class, or a Python function or class defined outside
the standard library), never to ``builtins:eval`` or ``os:system``; and a run folder's own config names no code
that resume imports unless the user says so (``fedsim run --resume RUN --trust-plugins``, or the same string
given on the command line: :func:`plugin_settings` lists what a config names)."""
from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from fedsim.errors import PluginError

# Where a config may name a plug-in (dotted keys of the raw config); a list's items are each one.
PLUGIN_KEYS = ("algorithm", "algorithm.name", "model.name", "model.client", "model.callbacks", "data.dataset",
               "data.partition", "data.partition.name")


def is_plugin(spec: str) -> bool:
    return ":" in spec


def _standard_library(module_name: str) -> bool:
    return module_name.split(".")[0] in sys.stdlib_module_names


def load_plugin(spec: str, field: str, kind: type | None = None) -> Any:
    """The object ``spec`` names: a subclass of ``kind`` when given, else a Python function or class; either
    defined outside the standard library. Anything else is a one-line error on ``field``."""
    module_name, _, attr = spec.partition(":")
    if not (module_name and attr.isidentifier() and all(p.isidentifier() for p in module_name.split("."))):
        raise PluginError(f"{field}: {spec!r} is not 'package.module:name'; give an importable module and the name "
                          "of a function or class in it")
    if _standard_library(module_name):
        raise PluginError(f"{field}: {spec!r} names the Python standard library; a plug-in is your own code "
                          "(a function or class in your package)")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise PluginError(f"{field}: cannot import {spec!r} ({err}); give 'package.module:name' importable "
                          "on every worker (an installed package, or PYTHONPATH)") from None
    own = inspect.isfunction(obj) or inspect.isclass(obj)
    if not own or _standard_library(getattr(obj, "__module__", "") or ""):
        raise PluginError(f"{field}: {spec!r} is a {type(obj).__name__} from {getattr(obj, '__module__', '?')}; a "
                          "plug-in is a function or class of your own code")
    if kind is not None and not (inspect.isclass(obj) and issubclass(obj, kind)):
        raise PluginError(f"{field}: {spec!r} is not a {kind.__module__}.{kind.__qualname__} subclass; name one")
    return obj


def plugin_settings(tree: dict[str, Any]) -> dict[str, str]:
    """Dotted key -> plug-in string, for every plug-in a raw config tree names (what importing it would run)."""
    found: dict[str, str] = {}
    for key in PLUGIN_KEYS:
        node: Any = tree
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        items = node if isinstance(node, list) else [node]
        for i, item in enumerate(items):
            spec = item.get("class_path") if isinstance(item, dict) else item
            if isinstance(spec, str) and is_plugin(spec):
                found[f"{key}[{i}]" if isinstance(node, list) else key] = spec
    return found


def names_code(cfg: Any) -> bool:
    """Whether a validated config (a RunConfig) names plug-ins: resuming its run then needs --trust-plugins."""
    return bool(plugin_settings(cfg.model_dump()))
