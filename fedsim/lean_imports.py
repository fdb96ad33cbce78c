"""torchmetrics without its optional integrations, so every process that trains (a worker, a local run's driver)
starts seconds sooner.

Lightning imports torchmetrics, and torchmetrics' package imports every metric it has, and with them whatever
optional package it finds installed: torchvision's models (and through them ``torch._dynamo``) for ARNIQA,
transformers for BERTScore, matplotlib for ``Metric.plot`` and scipy.signal for an old alias. Profiled on the
2-core machine: ``import pytorch_lightning`` 9.6-10.5 s with them, 4.2-4.3 s without (``python -X importtime``;
the machine was busy). fedsim uses torchmetrics' classification metrics and ``Metric`` only.

While torchmetrics' package runs, and only then, those four packages look uninstalled to the availability checks
it makes (``lightning_utilities.core.imports``). lightning_utilities' own cached answers are cleared afterwards, so
a later check there (and torchvision, transformers, ... themselves) sees the environment as it is; torchmetrics'
flags, and the parts it left out while they said no, keep the answer they got: in that process its FID, ARNIQA,
BERTScore and ``Metric.plot`` say their package is missing. A user whose module needs one of them sets
``FEDSIM_LEAN_IMPORTS=0`` in the environment a run starts from (workers inherit it; a cluster's job passes it in
its runtime_env), and torchmetrics loads whole, as it does without fedsim."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

OPTIONAL = frozenset({"torchvision", "transformers", "matplotlib", "scipy"})


@contextmanager
def _optional_hidden() -> Iterator[None]:
    """lightning_utilities' checks (``RequirementCache``, ``package_available``, ``module_available``) find none
    of ``OPTIONAL`` while the block runs."""
    from importlib.metadata import PackageNotFoundError

    from lightning_utilities.core import imports

    real_version, real_find_spec = imports._version, imports.find_spec

    def version(distribution_name: str) -> str:
        if distribution_name in OPTIONAL:
            raise PackageNotFoundError(distribution_name)
        return real_version(distribution_name)

    def find_spec(name: str, *args: Any, **kwargs: Any) -> importlib.machinery.ModuleSpec | None:
        return None if name.split(".")[0] in OPTIONAL else real_find_spec(name, *args, **kwargs)

    imports._version, imports.find_spec = version, find_spec
    try:
        yield
    finally:
        imports._version, imports.find_spec = real_version, real_find_spec
        imports.package_available.cache_clear()  # cached answers about OPTIONAL were the lie's
        imports.module_available.cache_clear()


class _LeanTorchmetrics(importlib.abc.MetaPathFinder):
    """Finds torchmetrics as Python would, with its package's code run under ``_optional_hidden``; once."""

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torchmetrics":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_package: Callable[[ModuleType], None] = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            with _optional_hidden():
                run_package(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec


OPT_OUT = "FEDSIM_LEAN_IMPORTS"  # "0": torchmetrics loads whole


def lean_torchmetrics() -> None:
    """Import torchmetrics (when something first does) without its optional integrations; a no-op once it is
    imported, the hook is in place, or the environment's ``FEDSIM_LEAN_IMPORTS`` is ``0``."""
    if os.environ.get(OPT_OUT) == "0" or "torchmetrics" in sys.modules:
        return
    if not any(isinstance(f, _LeanTorchmetrics) for f in sys.meta_path):
        sys.meta_path.insert(0, _LeanTorchmetrics())
