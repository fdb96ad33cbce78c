from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import FEDAVG, PARTS, Algorithm, MechanismState, Params

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedsim.algorithms.context import ClientContext
    from fedsim.core.layout import KeyParts


W_GLOBAL = 0.99  # a mean W from here on: the mixed layers are (almost) the global model's


class FedALAParams(Params):
    # Defaults: the paper's experimental setup (eta = 1.0, s = 80, p = 1; Zhang et al. 2023, Sec. 5); the start
    # phase's stopping rule is the authors' ALA module's (threshold 0.1 over the last 10 losses; FedALA/PFLlib ALA.py).
    eta: float = Field(1.0, gt=0, description="eta: step size of the aggregation weights W")
    rand_percent: int = Field(80, gt=0, le=100, description="s: percent of the client's training data sampled "
                              "each round to learn W on")
    layer_idx: int = Field(1, ge=1, description="p: the top layers (modules with parameters, counted from the "
                           "output) mixed by W; the lower ones take the received values (PFLlib's layer_idx counts "
                           "tensors: its 2 is one Linear, p = 1 here)")
    threshold: float = Field(0.1, gt=0, description="start phase: learn W until the std of the last num_pre_loss "
                             "pass losses is below this")
    num_pre_loss: int = Field(10, ge=2, description="start phase: how many of the latest pass losses the std covers")
    score: Literal["after_ala", "stored_w"] = Field(
        "after_ala", description="what a client is scored with: after_ala, its ALA step on the newest global model "
        "(W learned as its next round would, then dropped: PFLlib's serverala.py:26-31, 70-74 runs ALA for every "
        "client before evaluating); stored_w, the mix under the W of its last round, nothing learned")


class FedALA(Algorithm):
    """adaptive local aggregation: global into local model by learned element-wise weights (Zhang et al. 2023)

    Each client keeps its trained local model. On receiving the global model it takes the global values in the lower
    layers and local + (global - local) * W in the top ``layer_idx`` layers, W in [0, 1] element-wise (kept per
    client, starting at 1), learned by W <- clip(W - eta dL/dW) on a random s% of its data: until the pass loss
    settles in the client's first ALA (the paper's start phase), one pass in later rounds. Then ordinary local
    training from that model; the server averages the uploads (FedAvg). A client's first round has no local model
    yet: it starts from the global one (the paper's first iteration), so its start phase is its second round.
    Scoring uses the model the client would start from: by default its ALA step on the newest global model, W learned
    from the stored one as its next round would learn it (PFLlib's scores), then dropped (``score: stored_w``: the
    mix under the stored W, nothing learned). W is stored over the whole model (ones outside the top layers).
    """
    name, train, share = "fedala", "full", "full"
    Params = FedALAParams
    params: FedALAParams
    client_slots = {"local_model": "full", "ala_weights": "full"}
    own_objective = "learns its aggregation weights"
    packable = False  # ALA runs its own forward passes on ctx.net

    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        count = len(_layers(net))
        if self.params.layer_idx > count:
            raise ValueError(f"{self.name}: algorithm.layer_idx: {self.params.layer_idx} is more than the model's "
                             f"{count} layers with parameters; at most {count}")

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        ctx.load()
        local = ctx.slot("local_model", default=())  # empty before the client's first round
        if local.size:
            stored = ctx.slot("ala_weights", default=())
            weights = ctx.tensors("full", stored if stored.size else np.ones(local.size, np.float32))
            local_t = ctx.tensors("full", local)
            self._learn_weights(ctx, local_t, weights, until_settled=not stored.size)
            self._mix(ctx, local_t, weights)
            ctx.set_slot("ala_weights", ctx.vector("full", weights))
            # The mean of W over the mixed layers: 1 takes the global model there, 0 keeps the local one.
            top = self.top_keys(ctx.net)
            ctx.record("fedala_w_mean", float(sum(float(weights[k].sum()) for k in top)
                                              / sum(weights[k].numel() for k in top)))
        losses = ctx.sgd(PARTS[self.train], ctx.local_epochs)
        ctx.commit_model()
        ctx.set_slot("local_model", ctx.pack("full"))
        return losses

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        """W at 1 takes the global model in the mixed layers too (FedAvg); below, the client keeps some of its own."""
        if "fedala_w_mean" not in final:
            return None
        w = final["fedala_w_mean"]
        return MechanismState(f"W {w:.3g}", FEDAVG if w >= W_GLOBAL else None)

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        ctx.load()
        local = ctx.slot("local_model", default=())
        if local.size:
            stored = ctx.slot("ala_weights", default=())
            weights = ctx.tensors("full", stored if stored.size else np.ones(local.size, np.float32))
            local_t = ctx.tensors("full", local)
            if self.params.score == "after_ala":  # on copies: the client's stored W stays as its round left it
                self._learn_weights(ctx, local_t, weights, until_settled=not stored.size)
            self._mix(ctx, local_t, weights)

    def top_keys(self, net: nn.Module) -> list[str]:
        """The parameters W mixes: those of the top ``layer_idx`` layers."""
        return [key for layer in _layers(net)[-self.params.layer_idx:] for key in layer]

    def _mix(self, ctx: ClientContext, local: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> None:
        """Into the network holding the received model: local + (received - local) * W in the top layers. lerp is
        exact at W = 0 and W = 1 (local and received values bit for bit)."""
        import torch

        params = dict(ctx.net.named_parameters())
        with torch.no_grad():
            for k in self.top_keys(ctx.net):
                params[k].copy_(torch.lerp(local[k], params[k], weights[k]))

    def _learn_weights(self, ctx: ClientContext, local: dict[str, torch.Tensor], weights: dict[str, torch.Tensor],
                       until_settled: bool) -> None:
        """W <- clip(W - eta dL/dW, 0, 1) batch by batch over a random s% of the client's data (from its generator):
        one pass, or (start phase) passes until the std of the last num_pre_loss pass losses is below threshold."""
        import torch

        p = self.params
        x, y = ctx.data()
        keep = max(1, len(y) * p.rand_percent // 100)
        sample = torch.randperm(len(y), generator=ctx.generator)[:keep].to(y.device)
        data = (x[sample], y[sample])
        keys = self.top_keys(ctx.net)
        received = {k: v.detach().clone() for k, v in ctx.net.named_parameters()}  # lower layers: the global values
        for k in keys:
            weights[k].requires_grad_()
        losses: list[float] = []
        while True:
            losses.append(self._weights_pass(ctx, data, keys, local, received, weights))
            settled = len(losses) > p.num_pre_loss and float(np.std(losses[-p.num_pre_loss:])) < p.threshold
            if not until_settled or settled or not np.isfinite(losses[-1]):  # a diverged model never settles
                break
        for k in keys:
            weights[k].requires_grad_(False)

    def _weights_pass(self, ctx: ClientContext, data: tuple[torch.Tensor, torch.Tensor], keys: list[str],
                      local: dict[str, torch.Tensor], received: dict[str, torch.Tensor],
                      weights: dict[str, torch.Tensor]) -> float:
        """One pass of W's steps over the sample; its mean batch loss."""
        import torch
        from torch.nn import functional as F

        ctx.net.train()  # batch statistics, as training sees them; on copies, so the model's own stay untouched
        buffers = {k: b.clone() for k, b in ctx.net.named_buffers()}
        batch_losses = []
        for xb, yb in ctx.batches(1, data):
            mixed = {k: torch.lerp(local[k], received[k], weights[k]) for k in keys}
            logits = torch.func.functional_call(ctx.net, {**received, **buffers, **mixed}, (xb,))
            loss = F.cross_entropy(logits, yb)
            grads = torch.autograd.grad(loss, [weights[k] for k in keys])
            with torch.no_grad():
                for k, g in zip(keys, grads):
                    weights[k].sub_(self.params.eta * g).clamp_(0, 1)
            batch_losses.append(loss.detach())
        return float(torch.stack(batch_losses).mean())


def _layers(net: nn.Module) -> list[list[str]]:
    """Parameter keys grouped by the module that owns them, in the network's order (a Linear's weight and bias are
    one layer, a BatchNorm's affine another)."""
    layers: dict[str, list[str]] = {}
    for key, _ in net.named_parameters():
        layers.setdefault(key.rpartition(".")[0], []).append(key)
    return list(layers.values())
