from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import FEDAVG, LOCAL, PARTS, MechanismState, Params, PartialSharing
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext


DISTANCE_OFF = 1e-3  # ||v - w_global|| below this: the personal model is the global one


class DittoParams(Params):
    lam: float = Field(0.1, ge=0, alias="lambda", description="pull of the personal model toward the global one: "
                       "+ lambda/2 ||v - w_global||^2")
    personal_epochs: int | None = Field(None, ge=1, description="epochs on the personal model; null: train.local_epochs")


class Ditto(PartialSharing):
    """FedAvg global model + a personal model regularised toward it, used for scoring (Li et al. 2021)"""
    name, train, share = "ditto", "full", "full"
    # Li et al. 2021 (Ditto, ICML), Sec. 5 / App. C: each device picks lambda on its validation data from {0.05, 0.1,
    # 0.2} (strong attacks) or {0.1, 1, 2} (all other settings); the union is searched here.
    tunable = {"lambda": Distribution(choice=[0.05, 0.1, 0.2, 1.0, 2.0])}
    Params = DittoParams
    params: DittoParams
    client_slots = {"personal_model": "full"}
    packable = True  # ClientContext's primitives and penalties only

    def epochs_per_round(self, local_epochs: int) -> int:
        return local_epochs + (self.params.personal_epochs or local_epochs)  # global model, then personal model

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        losses = super().client_update(ctx)  # the global model's local update, uploaded
        ctx.load()  # the received global weights: the anchor of the personal model
        anchor = ctx.pack("full")
        pull = ctx.proximal(self.params.lam, keys=ctx.full_keys)
        ctx.unpack("full", self._personal_model(ctx))
        ctx.sgd(PARTS["full"], self.params.personal_epochs or ctx.local_epochs, penalty=pull)
        personal = ctx.pack("full")
        ctx.set_slot("personal_model", personal)
        # How far the personal model stands from the global one (0: Ditto is FedAvg; lambda sets the pull).
        ctx.record("ditto_distance", float(np.linalg.norm(personal.astype(np.float64) - anchor)))
        return losses

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        """lambda 0: the personal model trains alone from its own last state (local training); a personal model at
        the global one: FedAvg."""
        if "ditto_distance" not in final:
            return None
        distance = final["ditto_distance"]
        flag = LOCAL if self.params.lam == 0 else FEDAVG if distance < DISTANCE_OFF else None
        return MechanismState(f"||v - w|| {distance:.3g}", flag)

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        ctx.unpack("full", self._personal_model(ctx))

    @staticmethod
    def _personal_model(ctx: ClientContext) -> np.ndarray:
        return ctx.slot("personal_model", default=ctx.initial("full"))
