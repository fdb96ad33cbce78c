"""Algorithm registry. Adding a method = one file with an :class:`Algorithm` subclass, listed here; a user's
own method is named in a config as ``package.module:Class`` instead."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from fedsim.algorithms.apfl import APFL
from fedsim.algorithms.base import (FEDAVG, LOCAL, PARTS, Algorithm, BatchNormMode, MechanismState, PartialSharing,
                                   parameter_table)
from fedsim.algorithms.ditto import Ditto
from fedsim.algorithms.fedadam import FedAdam
from fedsim.algorithms.fedala import FedALA
from fedsim.algorithms.fedamp import FedAMP
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.fedavgm import FedAvgM
from fedsim.algorithms.fedbabu import FedBABU
from fedsim.algorithms.fedbn import FedBN
from fedsim.algorithms.fedfomo import FedFomo
from fedsim.algorithms.fedper import FedPer
from fedsim.algorithms.fedper_ft import FedPerFT
from fedsim.algorithms.fedprox import FedProx, FedProxBABU
from fedsim.algorithms.fedproto import FedProto
from fedsim.algorithms.fedrep import FedRep
from fedsim.algorithms.fedrod import FedRoD
from fedsim.algorithms.fedyogi import FedYogi
from fedsim.algorithms.ifca import IFCA
from fedsim.algorithms.lg_fedavg import LGFedAvg
from fedsim.algorithms.local import Local
from fedsim.algorithms.perfedavg import PerFedAvg
from fedsim.algorithms.pfedme import PFedMe
from fedsim.algorithms.scaffold import Scaffold
from fedsim.core.layout import KeyParts
from fedsim.core.protocol import WEIGHTS
from fedsim.plugins import Subclass, is_plugin, load_plugin

ALGORITHMS: dict[str, type[Algorithm]] = {a.name: a for a in (
    FedAvg, FedPer, Local, FedBABU, FedRep, FedPerFT, LGFedAvg, FedProx, FedProxBABU, Ditto,
    FedAvgM, FedAdam, FedYogi, Scaffold, FedBN, APFL, PerFedAvg, PFedMe, FedRoD, FedProto, FedALA, FedAMP,
    IFCA, FedFomo)}


def algorithm_class(name: str) -> type[Algorithm]:
    """A registered method by name, or a user's ``package.module:Class``."""
    if is_plugin(name):
        cls: type[Algorithm] = load_plugin(name, "algorithm.name", Subclass(Algorithm, "fedsim.algorithms.Algorithm"))
        return cls
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm.name: unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)} "
                         "or give 'package.module:Class'")
    return ALGORITHMS[name]


class _AlgorithmSection(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def params(self) -> Mapping[str, Any]: ...


class _ModelSection(Protocol):
    @property
    def batchnorm(self) -> BatchNormMode | None: ...


class _PrivacySection(Protocol):
    @property
    def dp(self) -> str: ...


class MethodChoice(Protocol):
    """What ``build_algorithm`` reads of a RunConfig, typed by its shape: fedsim.config imports this package."""
    @property
    def algorithm(self) -> _AlgorithmSection: ...
    @property
    def model(self) -> _ModelSection: ...
    @property
    def privacy(self) -> _PrivacySection | None: ...


def build_algorithm(cfg: MethodChoice) -> Algorithm:
    """The run's method with its validated parameters (``cfg``: a RunConfig)."""
    cls = algorithm_class(cfg.algorithm.name)
    return cls(cls.Params.model_validate(cfg.algorithm.params), batchnorm_mode(cfg, cls))


def mechanism_state(algorithm: Mapping[str, Any] | str, rows: Sequence[Mapping[str, Any]]) -> MechanismState | None:
    """A run's mechanism at its end: ``algorithm``, its config's algorithm section (``{name: fedamp, sigma: 1, ...}``
    or a bare name), ``rows`` its rounds.jsonl rows. The method reads the last value of each ``mechanism`` quantity
    and of each recorded mean; None for a method without a mechanism of its own (FedAvg) or a run that recorded none.
    ``MechanismState.flag`` says what the method is where its mechanism is off ("acts as local training", "acts as
    FedAvg")."""
    section = {"name": algorithm} if isinstance(algorithm, str) else dict(algorithm)
    cls = algorithm_class(section.pop("name"))
    return cls(cls.Params.model_validate(section)).mechanism_state(final_values(rows))


def final_values(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The last value of each of the rows' ``mechanism`` quantities and of each across-client statistic's mean
    (``ctx.record`` and ``self.log`` values: recorded on evaluated rounds only)."""
    final: dict[str, float] = {}
    for row in rows:
        final |= {key: float(value) for key, value in (row.get("mechanism") or {}).items()}
        final |= {key: float(stats["mean"]) for key, stats in row.items()
                  if key != "mechanism" and isinstance(stats, dict) and "mean" in stats}
    return final


def batchnorm_mode(cfg: MethodChoice, cls: type[Algorithm]) -> BatchNormMode | None:
    """model.batchnorm, else the method's default; but under DP (privacy.dp central or local) a method that would
    average BatchNorm's running statistics keeps them on each client instead (local_statistics, as SiloBN): they are
    not trained by gradients, would dominate the clipped update's norm (``num_batches_tracked`` alone grows by the
    steps taken) and a noised running variance can turn negative. Said when the run starts (``batchnorm_notice``)."""
    if cfg.model.batchnorm is not None:
        return cfg.model.batchnorm
    private = cfg.privacy is not None and cfg.privacy.dp != "none"
    return "local_statistics" if private and cls.batchnorm == "averaged" else None


def batchnorm_notice(cfg: MethodChoice, algorithm: Algorithm, keys: KeyParts) -> str | None:
    """The one line a run prints about BatchNorm (also at --dry-run): on a model without it, what a method or
    model.batchnorm that assumes it does then; else when DP chose BatchNorm's mode (a model with running statistics)."""
    if not keys.batchnorm:
        if cfg.model.batchnorm is not None:
            return (f"model.batchnorm: {cfg.model.batchnorm} has nothing to act on: the model has no BatchNorm layer; "
                    "leave it out")
        return algorithm.without_batchnorm
    if cfg.model.batchnorm is not None or algorithm.bn_mode != "local_statistics" or not keys.statistics:
        return None
    return ("model.batchnorm: local_statistics under privacy.dp: BatchNorm's running statistics stay on each client, "
            "outside the clipped and noised update (docs/privacy.md); set model.batchnorm: personal or batch_stats "
            "to choose otherwise")


__all__ = ["ALGORITHMS", "FEDAVG", "LOCAL", "PARTS", "WEIGHTS", "Algorithm", "KeyParts", "MechanismState",
           "PartialSharing", "algorithm_class", "batchnorm_mode", "batchnorm_notice", "build_algorithm", "final_values",
           "mechanism_state", "parameter_table"]
