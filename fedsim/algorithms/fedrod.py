from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import PARTS, Algorithm, Params

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedsim.algorithms.context import ClientContext
    from fedsim.core.layout import KeyParts

HEAD = "personal_head"  # the client slot: the personal head's weight (C x d, row-major), then its bias (C)


class FedRoDParams(Params):
    balanced: bool = Field(True, description="train the generic model with the balanced softmax loss, logits + log "
                           "of the client's class counts (paper Sec. 4, BSM; PFLlib's balanced_softmax_loss); false: "
                           "plain cross entropy")
    head_lr_scale: float = Field(1.0, gt=0, description="the personal head's lr as a multiple of train.head.lr "
                                 "(PFLlib's clientROD: the same learning rate as the model)")


class FedRoD(Algorithm):
    """generic model trained with balanced softmax and averaged, plus a personal head on its features (Chen & Chao 2022)

    Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022
    (Sec. 4, the linear personal head of Fig. 2), as PFLlib's clientROD: on every batch one step of the whole
    generic model (body + generic head, averaged like FedAvg) on the balanced softmax loss, then one step of the
    client's personal head on plain cross entropy of generic logits (detached) + personal head(representation,
    detached). The personal head starts as a copy of the round-0 generic head (PFLlib) and never leaves the client.
    Scoring uses the personalized logits (PFLlib's test_metrics).
    """
    name, train, share = "fedrod", "full", "full"
    Params = FedRoDParams
    params: FedRoDParams
    own_objective = "balanced softmax and a personal head"
    packable = False  # its own steps on ctx.net, and a personal head outside the network

    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        # The personal head is the output layer's size, known only once the model is built (here, in every process
        # that builds it, before a worker sizes its client slots).
        layer = _output_layer(net, keys)
        self.client_slots = {HEAD: layer.out_features * (layer.in_features + 1)}

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch
        from torch.nn import functional as F

        ctx.load()
        ctx.net.train()
        weight, bias = (t.clone().requires_grad_() for t in self._personal_head(ctx))
        generic = torch.optim.SGD(ctx.param_groups(PARTS["full"]))
        [settings] = ctx.param_groups(PARTS["head"])  # the run's head settings, for the personal head too
        personal = torch.optim.SGD([{**settings, "params": [weight, bias],
                                     "lr": settings["lr"] * self.params.head_lr_scale}])
        prior = self.log_prior(ctx) if self.params.balanced else 0.0
        losses = []
        for x, y in ctx.batches(ctx.local_epochs):
            z, logits = ctx.features(x)
            generic_loss = F.cross_entropy(logits + prior, y)
            generic.zero_grad()
            generic_loss.backward()
            generic.step()
            personal_loss = F.cross_entropy(logits.detach() + F.linear(z.detach(), weight, bias), y)
            personal.zero_grad()
            personal_loss.backward()
            personal.step()
            # The local objective is both losses: a personal head that diverges makes the client's round count as
            # diverged too, so nothing of it is kept.
            losses.append((generic_loss + personal_loss).detach())
        ctx.commit_model()
        ctx.set_slot(HEAD, torch.cat([weight.detach().flatten(), bias.detach()]).cpu().numpy())
        return losses

    @staticmethod
    def log_prior(ctx: ClientContext) -> torch.Tensor:
        """log of the client's training label counts per class, -inf for a class it lacks (balanced softmax: the
        generic logits + log p(y) fit the client's skewed label distribution, so the logits stay balanced)."""
        import torch

        _, y = ctx.data()
        # Counted on the host: CUDA's bincount has no deterministic kernel.
        counts = torch.bincount(y.cpu(), minlength=ctx.output_layer.out_features)
        return counts.to(device=y.device, dtype=torch.float32).log()

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        from torch.nn import functional as F

        ctx.load()
        weight, bias = self._personal_head(ctx)
        # Scored with the personalized logits: the generic ones + the personal head's of the same representation.
        ctx.score_with(lambda representation, logits: logits + F.linear(representation.detach(), weight, bias))

    @staticmethod
    def _personal_head(ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's personal head (weight C x d, bias C) on the model's device."""
        import torch

        layer = ctx.output_layer
        stored = ctx.slot(HEAD, default=np.empty(0, np.float32))  # empty before the client's first round
        if stored.size:
            flat = torch.tensor(stored, device=layer.weight.device)
            split = layer.weight.numel()
            return flat[:split].view_as(layer.weight), flat[split:]
        name = next(n for n, m in ctx.net.named_modules() if m is layer)
        initial = ctx.tensors("full", ctx.initial("full"))
        bias = initial.get(f"{name}.bias", torch.zeros(layer.out_features, device=layer.weight.device))
        return initial[f"{name}.weight"], bias


def _output_layer(net: nn.Module, keys: KeyParts) -> nn.Linear:
    from fedsim.models.state import output_layer

    try:
        return output_layer(net, keys.head)
    except ValueError:
        raise ValueError("model.personal_layers: fedrod's personal head mirrors the head's last nn.Linear, and this "
                         "head has none; give the model a head (model.personal_layers >= 1) ending in an nn.Linear") \
            from None
