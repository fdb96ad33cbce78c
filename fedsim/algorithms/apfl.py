from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import PARTS, Params, PartialSharing
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext


class APFLParams(Params):
    alpha: float = Field(0.5, ge=0, le=1, description="initial mixing weight of the personal model")
    adaptive: bool = Field(True, description="learn each client's alpha by gradient descent (APFL's adaptive variant)")
    alpha_lr: float | None = Field(None, ge=0, description="step size for alpha; null: train.body.lr")


class APFL(PartialSharing):
    """a personal model v mixed with the global w as alpha v + (1 - alpha) w, scored mixed (Deng et al. 2020)"""
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
        alpha = torch.tensor(float(ctx.slot("alpha", default=[self.params.alpha])[0]), requires_grad=True)
        lr = ctx.learning_rates("full").max()
        alpha_lr = lr if self.params.alpha_lr is None else self.params.alpha_lr
        buffers = dict(ctx.net.named_buffers())
        # Algorithm 1 steps w, v and alpha from one iterate: v's and alpha's gradients are taken at the mixture with w
        # as it was before its step on the batch. Mixed with w after that step, w would fit every batch better than
        # v does, and alpha's gradient <v - w, grad> would push it to 0 (APFL scoring as FedAvg).
        before = {k: global_params[k].detach().clone() for k in keys}

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

        losses = ctx.sgd(PARTS["full"], ctx.local_epochs, after_step=personal_step)
        ctx.commit_model()
        ctx.set_slot("personal_model", ctx.vector("full", {k: t.detach() for k, t in personal.items()}))
        ctx.set_slot("alpha", [float(alpha.detach())])
        return losses

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        import torch

        ctx.load()
        alpha = float(ctx.slot("alpha", default=[self.params.alpha])[0])
        personal = ctx.tensors("full", self._personal_model(ctx))
        with torch.no_grad():
            for k, w in ctx.net.named_parameters():
                w.copy_(alpha * personal[k] + (1 - alpha) * w)

    @staticmethod
    def _personal_model(ctx: ClientContext) -> np.ndarray:
        return ctx.slot("personal_model", default=ctx.initial("full"))
