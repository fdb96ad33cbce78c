"""User code named in a config as ``package.module:name`` - an algorithm, model, dataset, partition or
client module - imported without editing fedsim."""
from __future__ import annotations

import importlib
from typing import Any


class PluginError(ValueError):
    """A ``package.module:name`` that cannot be imported (one line naming the field and the fix)."""


def is_plugin(spec: str) -> bool:
    return ":" in spec


def load_plugin(spec: str, field: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise PluginError(f"{field}: cannot import {spec!r} ({err}); give 'package.module:name' importable "
                          "on every worker (an installed package, or PYTHONPATH)") from None
