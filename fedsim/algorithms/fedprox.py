from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing
from fedsim.algorithms.fedbabu import FedBABU, FedBABUParams
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    from fedsim.algorithms.context import ClientContext, Penalty


class FedProxParams(Params):
    mu: float = Field(0.01, ge=0, description="proximal coefficient: + mu/2 ||w - w_global||^2 over shared weights")


class FedProx(PartialSharing):
    """FedAvg + proximal term mu/2 ||w - w_global||^2 (Li et al. 2020); mu = 0 is FedAvg bit for bit"""
    name, train, share = "fedprox", "full", "full"
    # Li et al. 2020 (FedProx, MLSys), Sec. 5.3: "the best mu from the limited candidate set {0.001, 0.01, 0.1, 1}".
    tunable = {"mu": Distribution(choice=[0.001, 0.01, 0.1, 1.0])}
    Params = FedProxParams
    params: FedProxParams
    packable = True  # ClientContext's primitives and penalties only

    def penalty(self, ctx: ClientContext) -> Penalty | None:
        return ctx.proximal(self.params.mu)


class FedProxBABUParams(FedBABUParams, FedProxParams):
    pass


class FedProxBABU(FedBABU):
    """FedProx on the body under FedBABU's fixed head (FedBABU paper, App. M)"""
    name = "fedprox_babu"
    tunable = FedProx.tunable  # FedProx's mu, from the same candidate set
    Params = FedProxBABUParams
    params: FedProxBABUParams
    packable = True  # ClientContext's primitives and penalties only

    def penalty(self, ctx: ClientContext) -> Penalty | None:
        return ctx.proximal(self.params.mu)
