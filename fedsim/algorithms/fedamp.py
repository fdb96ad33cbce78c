from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import LOCAL, Group, MechanismState, Params, PartialSharing
from fedsim.config.schema import Distribution
from fedsim.core.protocol import WEIGHTS, Reply

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedsim.algorithms.context import ClientContext, Penalty
    from fedsim.core.layout import KeyParts

MODELS = "models"  # server state: every client's latest uploaded model, one row per client
# A mean self-weight from here on: u_i is (almost) the client's own model, so it trains alone.
SELF_WEIGHT_LOCAL = 0.99


class FedAMPParams(Params):
    # alpha_k and lambda: PFLlib's (system/main.py:447, 461: 1.0 each; alpha_k held constant, not decayed by round). The
    # paper leaves sigma and alpha_k to tuning. PFLlib's sigma = 1 (main.py:463) makes the attention vanish on a CNN:
    # A'(d) = exp(-d/sigma)/sigma of the squared distances between cnn4 models (a median 4.6 after one round of the
    # leaderboard's CIFAR-100 pathological CPU setting, 16 after five) left a mean self-weight of 0.99999 after 5
    # rounds, i.e. local training. sigma = 50, about ten times that first median, keeps the others' models in u_i for
    # the run (measured there: mean self-weight 0.66 after round 1, 0.68 after 5; sigma 20: 0.25). rounds.jsonl
    # records the self-weights and the median distance (``mechanism``), the scale to set sigma by for another model.
    alpha_k: float = Field(1.0, gt=0, description="alpha_k: step size of the attention; xi_ij = alpha_k A'(||w_i - "
                           "w_j||^2), and the proximal pull is lambda / alpha_k (PFLlib: 1)")
    lam: float = Field(1.0, ge=0, alias="lambda", description="lambda: + lambda/(2 alpha_k) ||w - u_i||^2 in local "
                       "training (PFLlib: 1)")
    sigma: float = Field(50.0, gt=0, description="sigma of the attention A'(x) = exp(-x/sigma)/sigma, in units of the "
                         "squared distance between two clients' models (see rounds.jsonl's fedamp_distance_median)")


class FedAMP(PartialSharing):
    """attentive message passing: each client pulled toward its own attention-weighted model mix (Huang et al. 2021)

    The server keeps every client's latest uploaded model w_j (an N x D float32 array: 20 clients of cnn4 on
    CIFAR-100, D = 139,304, hold 11 MB; a round costs sampled x N distances over D values). A client i to train
    receives u_i = sum_j xi_ij w_j with xi_ij = alpha_k A'(||w_i - w_j||^2) for j != i, A'(x) = exp(-x/sigma)/sigma
    (the paper's negative exponential), and xi_ii = 1 - sum_{j != i} xi_ij, never below 0 (``weights``); j runs over
    all clients (the paper's cross-silo setting; a client not yet trained counts with the initial model), not only
    those of the last round (PFLlib). Distances cover the parameters alone: BatchNorm's statistics, and its step count in particular, say
    nothing of how alike two clients are. The client trains from u_i with + lambda/(2 alpha_k) ||w - u_i||^2,
    uploads w, keeps it as its personal model and is scored with it. The server's weights (saved as the run's
    model) are the plain mean of the clients' models; no client trains from them. Attention arithmetic is float64,
    in client order.

    Checked against the paper's Algorithm 1 (Huang et al., AAAI 2021, arXiv 2007.03797: U^k = W^{k-1} - alpha_k
    grad A(W^{k-1}), then W^k = argmin F(W) + lambda/(2 alpha_k) ||W - U^k||^2): the proximal weight is the paper's
    lambda/(2 alpha_k) (``ctx.proximal(lambda / alpha_k)``, coef/2 ||w - u_i||^2, with its gradient), and the client
    solves that proximal problem warm-started at its centre u_i. The authors published no code. PFLlib's clientamp.py
    differs on both: its client trains on from its own previous model, and its term 0.5 lambda/alpha_k ||w - u_i||
    (a norm, not its square) is built from ``p.data``, which carries no gradient, so its local update is plain local
    training whatever alpha_k, lambda and sigma are.
    """
    name, train, share = "fedamp", "full", "full"
    # The paper leaves alpha_k and sigma to tuning. alpha_k: PFLlib's two settings (main.py's default 1; its example
    # runs 1e3). sigma: PFLlib's 1 and this file's 50 with a decade around them, because sigma only matters against
    # the squared distances between clients' models (a median ~4.6 on cnn4, above): PFLlib's example sigma 0.1 there
    # gives every client its own model alone (local training), so it is not searched.
    tunable = {"alpha_k": Distribution(choice=[1.0, 1000.0]), "sigma": Distribution(choice=[1.0, 10.0, 50.0, 200.0])}
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
        """xi_client,j for every j (float64, summing to 1, every one >= 0)."""
        own = models[client, self.parameter_mask].astype(np.float64)
        distances = np.zeros(len(models), np.float64)
        for j in range(len(models)):
            if j != client:
                gap = models[j, self.parameter_mask] - own
                distances[j] = float(gap @ gap)
        return self.weights(distances, client)

    def weights(self, distances: np.ndarray, client: int) -> np.ndarray:
        """xi_client,j from the squared distances of the client's model to every model: alpha_k A'(d) for the others;
        if those sum past 1, they are scaled to sum to 1, so that the self-weight xi_ii = 1 - sum is never negative and
        u_i stays a convex combination of the models (the paper's Sec. 3 reads u_i as one; a larger alpha_k would
        extrapolate away from the client's own model)."""
        p = self.params
        xi = p.alpha_k * np.exp(-distances / p.sigma) / p.sigma
        xi[client] = 0.0
        peers = xi.sum()
        if peers > 1:
            xi /= peers
        xi[client] = max(0.0, 1.0 - xi.sum())  # 0, not -1e-16, where the others were scaled to sum to 1
        return xi

    def mechanism(self, state: dict[str, np.ndarray]) -> dict[str, float]:
        """The self-weight xi_ii every client would get from the server's models now (1: it trains alone, as local
        training; near 1 - (N-1) alpha_k / sigma: the others' models count fully), and the median squared distance
        between two clients' models, the scale sigma is compared with. N^2 / 2 distances over the parameters."""
        models = state[MODELS]
        rows = models[:, self.parameter_mask]
        n = len(rows)
        distances = np.zeros((n, n), np.float64)
        for i in range(n):
            for j in range(i + 1, n):
                gap = rows[j].astype(np.float64) - rows[i]
                distances[i, j] = distances[j, i] = float(gap @ gap)
        self_weights = [self.weights(distances[i], i)[i] for i in range(n)]
        pairs = distances[np.triu_indices(n, 1)]
        return {"fedamp_self_weight_mean": float(np.mean(self_weights)),
                "fedamp_self_weight_min": float(np.min(self_weights)),
                "fedamp_distance_median": float(np.median(pairs)) if pairs.size else 0.0}

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        if "fedamp_self_weight_mean" not in final:
            return None
        weight = final["fedamp_self_weight_mean"]
        return MechanismState(f"self-weight {weight:.3g}", LOCAL if weight >= SELF_WEIGHT_LOCAL else None)

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
