from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import PARTS, Params, PartialSharing
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext


class APFLParams(Params):
    variant: Literal["paper", "pfllib"] = Field(
        "paper", description="paper: Algorithm 1 of Deng et al. (v and alpha stepped at the mixture, scored with "
        "alpha v + (1 - alpha) w_global); pfllib: PFLlib's clientapfl.py (v on its own loss, alpha's gradient + 0.02 "
        "alpha, v replaced by the mixture at the round's end and scored alone)")
    alpha: float | None = Field(None, ge=0, le=1, description="initial mixing weight of the personal model; null: 0.5 "
                                "(paper; the authors' FedTorch parameters.py:68) or 1.0 (pfllib: main.py:465)")
    adaptive: bool = Field(True, description="learn each client's alpha by gradient descent (APFL's adaptive variant)")
    alpha_lr: float | None = Field(None, ge=0, description="step size for alpha; null: train.body.lr")


class APFL(PartialSharing):
    """a personal model v mixed with the global w as alpha v + (1 - alpha) w, scored mixed (Deng et al. 2020)

    ``variant: pfllib`` runs PFLlib's APFL (system/flcore/clients/clientapfl.py:22-78), whose column PFLlib's
    leaderboard prints: per batch, w's step, then v's plain step on v's own loss, then alpha <- clip(alpha - lr
    (<v - w, alpha grad v + (1 - alpha) grad w> + 0.02 alpha)) (its alpha_update, after FedTorch's flow_utils.py);
    at the round's end v <- alpha v + (1 - alpha) w, and v alone is scored. The APFL authors' own code (FedTorch)
    mixes outputs rather than parameters, which fedsim's scoring of one network does not express.
    """
    name, train, share = "apfl", "full", "full"
    # Deng et al. 2020 (APFL), Sec. 6: the experiments run alpha in {0.25, 0.5, 0.75}.
    tunable = {"alpha": Distribution(choice=[0.25, 0.5, 0.75])}
    Params = APFLParams
    params: APFLParams
    client_slots = {"personal_model": "full", "alpha": 1}
    packable = False  # its mixed forward runs the module itself (ctx.net) and learns alpha after every step

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch
        from torch.nn import functional as F

        ctx.load()
        global_params = dict(ctx.net.named_parameters())
        personal = ctx.tensors("full", self._personal_model(ctx))
        keys = [k for k in personal if k in global_params]
        for k in keys:
            personal[k].requires_grad_()
        alpha = torch.tensor(float(ctx.slot("alpha", default=[self.start_alpha])[0]), requires_grad=True)
        lr = ctx.learning_rates("full").max()
        alpha_lr = lr if self.params.alpha_lr is None else self.params.alpha_lr
        buffers = dict(ctx.net.named_buffers())
        # Algorithm 1 steps w, v and alpha from one iterate: v's and alpha's gradients are taken at the mixture with w
        # as it was before its step on the batch. Mixed with w after that step, w would fit every batch better than
        # v does, and alpha's gradient <v - w, grad> would push it to 0 (APFL scoring as FedAvg).
        before = {k: global_params[k].detach().clone() for k in keys}

        def pfllib_step(x: torch.Tensor, y: torch.Tensor) -> None:
            # After w's step on the batch: v's own step, then alpha's with w's gradient of that step.
            scratch = {k: b.clone() for k, b in buffers.items()}
            loss = F.cross_entropy(torch.func.functional_call(ctx.net, {**personal, **scratch}, (x,)), y)
            grads = torch.autograd.grad(loss, [personal[k] for k in keys])
            with torch.no_grad():
                for k, g in zip(keys, grads):
                    personal[k] -= lr * g
                slope = 0.02 * alpha  # PFLlib's alpha_update: v and w after their steps, their gradients before
                for k, g in zip(keys, grads):
                    w_grad = global_params[k].grad
                    assert w_grad is not None, "apfl (pfllib): w's gradient of its step is gone"
                    slope = slope + ((personal[k] - global_params[k]) * (alpha * g + (1 - alpha) * w_grad)).sum()
                if self.params.adaptive:
                    alpha.copy_((alpha - alpha_lr * slope).clamp(0, 1))

        def personal_step(x: torch.Tensor, y: torch.Tensor) -> None:
            # After each step of w on the batch: v (through the mixture) and alpha on the same batch.
            mixed = {k: alpha * personal[k] + (1 - alpha) * before[k] for k in keys}
            scratch = {k: b.clone() for k, b in buffers.items()}  # w's BatchNorm statistics stay w's own
            loss = F.cross_entropy(torch.func.functional_call(ctx.net, {**mixed, **scratch}, (x,)), y)
            grads = torch.autograd.grad(loss, [personal[k] for k in keys] + [alpha])
            with torch.no_grad():
                for k, g in zip(keys, grads):
                    personal[k] -= lr * g
                if self.params.adaptive:
                    alpha.copy_((alpha - alpha_lr * grads[-1]).clamp(0, 1))
                for k in keys:
                    before[k].copy_(global_params[k])

        losses = ctx.sgd(PARTS["full"], ctx.local_epochs,
                         after_step=pfllib_step if self.params.variant == "pfllib" else personal_step)
        ctx.commit_model()
        if self.params.variant == "pfllib":  # v becomes the mixture, the model the client is scored with
            with torch.no_grad():
                for k in keys:
                    personal[k] = alpha * personal[k] + (1 - alpha) * global_params[k]
        ctx.set_slot("personal_model", ctx.vector("full", {k: t.detach() for k, t in personal.items()}))
        ctx.set_slot("alpha", [float(alpha.detach())])
        ctx.record("apfl_alpha", float(alpha.detach()))  # 0: scored as the global model; 1: as its personal one
        return losses

    @property
    def start_alpha(self) -> float:
        if self.params.alpha is not None:
            return self.params.alpha
        return 1.0 if self.params.variant == "pfllib" else 0.5

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        import torch

        ctx.load()
        if self.params.variant == "pfllib":  # v alone: the mixture the round ended with
            stored = ctx.slot("personal_model", default=())
            if stored.size:
                ctx.unpack("full", stored)
            return
        alpha = float(ctx.slot("alpha", default=[self.start_alpha])[0])
        personal = ctx.tensors("full", self._personal_model(ctx))
        with torch.no_grad():
            for k, w in ctx.net.named_parameters():
                w.copy_(alpha * personal[k] + (1 - alpha) * w)

    @staticmethod
    def _personal_model(ctx: ClientContext) -> np.ndarray:
        return ctx.slot("personal_model", default=ctx.initial("full"))
