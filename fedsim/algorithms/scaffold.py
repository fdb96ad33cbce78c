from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import PARTS, Params, PartialSharing
from fedsim.core.protocol import WEIGHTS

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext


class ScaffoldParams(Params):
    server_lr: float = Field(1.0, gt=0, description="global step size eta_g on the averaged model change")


class Scaffold(PartialSharing):
    """local steps corrected by control variates c - c_i against client drift (Karimireddy et al. 2020)"""
    name, train, share = "scaffold", "full", "full"
    Params = ScaffoldParams
    params: ScaffoldParams
    client_slots = {"control": "shared"}
    uploads = {WEIGHTS: None, "control": "uniform"}
    server_slots = ("control",)
    broadcast = (WEIGHTS, "control")
    packable = True  # ClientContext's primitives and penalties only

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        ctx.load()
        received = ctx.pack("shared")
        server_c = ctx.broadcast["control"]
        own_c = ctx.slot("control", default=np.zeros_like(server_c))
        # Loss + <c - c_i, w>: its gradient adds c - c_i to every step's gradient, and a user's own loss keeps it.
        losses = ctx.sgd(PARTS[self.train], ctx.local_epochs, penalty=ctx.linear(server_c - own_c))
        trained = ctx.pack("shared")
        ctx.commit_model()
        # Option II: c_i+ = c_i - c + (x - y_i) / (K lr), over parameters (buffers have no gradient).
        step = ctx.learning_rates("shared") * len(losses)
        change = np.where(step > 0, (received - trained) / np.where(step > 0, step, 1) - server_c, 0).astype(np.float32)
        ctx.set_slot("control", own_c + change)
        ctx.upload("control", change)
        return losses

    server_update_by_tensor = True  # element by element

    def server_update(self, state: dict[str, np.ndarray], means: dict[str, np.ndarray], sampled: int,
                      num_clients: int) -> None:
        # w + eta_g (avg - w), written so that eta_g = 1 gives the average exactly.
        avg, weights = means[WEIGHTS], state[WEIGHTS].astype(np.float64)
        state[WEIGHTS] = (avg + (self.params.server_lr - 1) * (avg - weights)).astype(np.float32)
        state["control"] = (state["control"] + sampled / num_clients * means["control"]).astype(np.float32)
