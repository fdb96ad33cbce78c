"""Algorithm registry. Adding a method = one file with an :class:`Algorithm` subclass, listed here; a user's
own method is named in a config as ``package.module:Class`` instead."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fedsim.algorithms.apfl import APFL
from fedsim.algorithms.base import PARTS, Algorithm, BatchNormMode, PartialSharing, parameter_table
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


class MethodChoice(Protocol):
    """What ``build_algorithm`` reads of a RunConfig, typed by its shape: fedsim.config imports this package."""
    @property
    def algorithm(self) -> _AlgorithmSection: ...
    @property
    def model(self) -> _ModelSection: ...


def build_algorithm(cfg: MethodChoice) -> Algorithm:
    """The run's method with its validated parameters (``cfg``: a RunConfig)."""
    cls = algorithm_class(cfg.algorithm.name)
    return cls(cls.Params.model_validate(cfg.algorithm.params), cfg.model.batchnorm)


__all__ = ["ALGORITHMS", "PARTS", "WEIGHTS", "Algorithm", "KeyParts", "PartialSharing", "algorithm_class",
           "build_algorithm", "parameter_table"]
