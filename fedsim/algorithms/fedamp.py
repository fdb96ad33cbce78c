from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import Group, Params, PartialSharing
from fedsim.config.schema import Distribution
from fedsim.core.protocol import WEIGHTS, Reply

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedsim.algorithms.context import ClientContext, Penalty
    from fedsim.core.layout import KeyParts

MODELS = "models"  # server state: every client's latest uploaded model, one row per client


class FedAMPParams(Params):
    # Defaults: PFLlib's (main.py: alphaK 1.0, lamda 1.0, sigma 1.0). The paper leaves them to tuning; PFLlib's own
    # example runs used alphaK 1e3, lambda 1, sigma 0.1. alpha_k is held constant (PFLlib), not decayed by round.
    alpha_k: float = Field(1.0, gt=0, description="alpha_k: step size of the attention; xi_ij = alpha_k A'(||w_i - "
                           "w_j||^2), and the proximal pull is lambda / alpha_k")
    lam: float = Field(1.0, ge=0, alias="lambda", description="lambda: + lambda/(2 alpha_k) ||w - u_i||^2 in local "
                       "training")
    sigma: float = Field(1.0, gt=0, description="sigma of the attention A'(x) = exp(-x/sigma)/sigma")


class FedAMP(PartialSharing):
    """attentive message passing: each client pulled toward its own attention-weighted model mix (Huang et al. 2021)

    The server keeps every client's latest uploaded model w_j (an N x D float32 array: 20 clients of cnn4 on
    CIFAR-100, D = 139,304, hold 11 MB; a round costs sampled x N distances over D values). A client i to train
    receives u_i = sum_j xi_ij w_j with xi_ij = alpha_k A'(||w_i - w_j||^2) for j != i, A'(x) = exp(-x/sigma)/sigma
    (the paper's negative exponential), and xi_ii = 1 - sum_{j != i} xi_ij; j runs over all clients (the paper's
    cross-silo setting; a client not yet trained counts with the initial model), not only those of the last round
    (PFLlib). Distances cover the parameters alone: BatchNorm's statistics, and its step count in particular, say
    nothing of how alike two clients are. The client trains from u_i with + lambda/(2 alpha_k) ||w - u_i||^2,
    uploads w, keeps it as its personal model and is scored with it. The server's weights (saved as the run's
    model) are the plain mean of the clients' models; no client trains from them. Attention arithmetic is float64,
    in client order.
    """
    name, train, share = "fedamp", "full", "full"
    # PFLlib's two settings (main.py's defaults alphaK 1, sigma 1; its example runs alphaK 1e3, sigma 0.1), each
    # parameter drawn from both: the paper leaves them to tuning.
    tunable = {"alpha_k": Distribution(choice=[1.0, 1000.0]), "sigma": Distribution(choice=[0.1, 1.0])}
    Params = FedAMPParams
    params: FedAMPParams
    client_slots = {"personal_model": "full"}
    aggregation = "replies"
    packable = True  # ClientContext's primitives and penalties only

    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        # Where the shared vector holds parameters (layouts list the state dict's keys in order): the server's
        # distances use these values only.
        shared, params = self.shared_keys(keys), {k for k, _ in net.named_parameters()}
        self.parameter_mask = np.concatenate([np.zeros(0, bool)] + [
            np.full(t.numel(), k in params) for k, t in net.state_dict().items() if k in shared])

    # -- server ------------------------------------------------------------------------------------
    def server_state(self, initial: np.ndarray, num_clients: int, seed: int) -> dict[str, np.ndarray]:
        return {WEIGHTS: initial, MODELS: np.tile(initial, (num_clients, 1))}

    def attention(self, models: np.ndarray, client: int) -> np.ndarray:
        """xi_client,j for every j (float64, summing to 1)."""
        p, mask = self.params, self.parameter_mask
        own = models[client, mask].astype(np.float64)
        xi = np.zeros(len(models), np.float64)
        for j in range(len(models)):
            if j != client:
                gap = models[j, mask] - own
                xi[j] = p.alpha_k * np.exp(-float(gap @ gap) / p.sigma) / p.sigma
        xi[client] = 1.0 - xi.sum()
        return xi

    def aggregate(self, models: np.ndarray, client: int) -> np.ndarray:
        """u_client = sum_j xi_client,j w_j, summed in client order in float64."""
        total = np.zeros(models.shape[1], np.float64)
        for xi, row in zip(self.attention(models, client), models):
            total += xi * row
        return total.astype(np.float32)

    def broadcast_groups(self, state: dict[str, np.ndarray], clients: list[int], training: bool) -> list[Group]:
        if not training:  # scored with its own model: nothing to send
            return [(list(clients), {})]
        return [([c], {WEIGHTS: self.aggregate(state[MODELS], c)}) for c in clients]

    def server_replies(self, state: dict[str, np.ndarray], replies: list[Reply], num_clients: int) -> None:
        models = state[MODELS].copy()
        for reply in replies:
            models[reply.client] = reply.uploads[WEIGHTS]
        mean = np.zeros(models.shape[1], np.float64)
        for row in models:
            mean += row
        state[MODELS] = models
        state[WEIGHTS] = (mean / len(models)).astype(np.float32)

    # -- client ------------------------------------------------------------------------------------
    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        losses = super().client_update(ctx)  # from u_i, pulled toward it; uploads the trained model
        ctx.set_slot("personal_model", ctx.pack("full"))
        return losses

    def penalty(self, ctx: ClientContext) -> Penalty | None:
        return ctx.proximal(self.params.lam / self.params.alpha_k)

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        ctx.unpack("full", ctx.slot("personal_model", default=ctx.initial("full")))
