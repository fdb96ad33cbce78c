from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.algorithms.base import PARTS, Params, PartialSharing
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext, LogitAdjustment


class APFLParams(Params):
    variant: Literal["paper", "pfllib", "fedtorch"] = Field(
        "paper", description="paper: Algorithm 1 of Deng et al. (v and alpha stepped at the mixture, scored with "
        "alpha v + (1 - alpha) w_global); pfllib: PFLlib's clientapfl.py (v on its own loss, alpha's gradient + 0.02 "
        "alpha, v replaced by the mixture at the round's end and scored alone); fedtorch: the authors' FedTorch "
        "(comms/trainings/federated/centered/apfl.py:87-117: outputs mixed, alpha v(x) + (1 - alpha) w(x), v stepped "
        "on the mixed output's loss, alpha stepped once a round; scored with the outputs of v and of the client's own "
        "w mixed, :128-134)")
    alpha: float | None = Field(None, ge=0, le=1, description="initial mixing weight of the personal model; null: 0.5 "
                                "(paper and fedtorch: the authors' FedTorch parameters.py:68) or 1.0 (pfllib: "
                                "main.py:465)")
    adaptive: bool | None = Field(None, description="learn each client's alpha by gradient descent (APFL's adaptive "
                                  "variant); null: true (paper, pfllib), false (fedtorch: --fed_adaptive_alpha "
                                  "defaults to False, FedTorch parameters.py:70)")
    alpha_lr: float | None = Field(None, ge=0, description="step size for alpha; null: train.body.lr (FedTorch "
                                   "passes the round's lr, centered/apfl.py:115-116)")

    @model_validator(mode="after")
    def _variants_adaptive(self) -> APFLParams:
        # resolved here, so that a run's stored settings (and the fingerprint of a kept paper run) say true or false
        if self.adaptive is None:
            self.adaptive = self.variant != "fedtorch"
        return self


class APFL(PartialSharing):
    """a personal model v mixed with the global w as alpha v + (1 - alpha) w, scored mixed (Deng et al. 2020)

    ``variant: pfllib`` runs PFLlib's APFL (system/flcore/clients/clientapfl.py:22-78), whose column PFLlib's
    leaderboard prints: per batch, w's step, then v's plain step on v's own loss, then alpha <- clip(alpha - lr
    (<v - w, alpha grad v + (1 - alpha) grad w> + 0.02 alpha)) (its alpha_update, after FedTorch's flow_utils.py);
    at the round's end v <- alpha v + (1 - alpha) w, and v alone is scored.

    ``variant: fedtorch`` runs the APFL authors' own code, FedTorch (fedtorch/comms/trainings/federated/centered/
    apfl.py, the simulation's loop; federated/apfl.py:94-123 the same per batch), which mixes outputs, not
    parameters: per batch, w's step on its own loss (:88-98), then v's step on the loss of the mixed output
    alpha v(x) + (1 - alpha) w(x) with w after its step (:100-111; comms/utils/eval.py:31-39 inference_personal),
    and, only on a round's first batch and only with --fed_adaptive_alpha (off by default, parameters.py:70),
    alpha <- clip(alpha - lr (<v - w, alpha grad_v + (1 - alpha) grad_w> + 0.02 alpha), 0, 1) with v and w after
    their steps and both gradients of the mixed loss (:113-116; comms/utils/flow_utils.py:240-250 alpha_update). The
    client is scored with the output mixture of v and of its own w as its local training left it, before
    aggregation (:128-134, eval.py:92-94); fedsim keeps that w in a client slot (the global model before the
    client's first round). v's steps are plain SGD at the round's lr (FedTorch's second optimizer takes the run's).
    """
    name, train, share = "apfl", "full", "full"
    # Deng et al. 2020 (APFL), Sec. 6: the experiments run alpha in {0.25, 0.5, 0.75}.
    tunable = {"alpha": Distribution(choice=[0.25, 0.5, 0.75])}
    Params = APFLParams
    params: APFLParams
    # local_model: fedtorch's w as the client's training left it, the w its output mixture is scored with
    client_slots = {"personal_model": "full", "alpha": 1, "local_model": "full"}
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
                if self.adaptive:
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
                if self.adaptive:
                    alpha.copy_((alpha - alpha_lr * grads[-1]).clamp(0, 1))
                for k in keys:
                    before[k].copy_(global_params[k])

        first_batch = [True]  # FedTorch steps alpha on a round's first batch only (centered/apfl.py:114)

        def fedtorch_step(x: torch.Tensor, y: torch.Tensor) -> None:
            # After w's step on the batch: v's step on the loss of the mixed outputs, w's output from w after its step.
            scratch = {k: b.clone() for k, b in buffers.items()}  # w's BatchNorm statistics stay w's own
            v_out = torch.func.functional_call(ctx.net, {**personal, **scratch}, (x,))
            w_out = torch.func.functional_call(ctx.net, {k: b.clone() for k, b in buffers.items()}, (x,))
            mixing = alpha.detach()  # a constant of the loss: FedTorch's alpha is a float (eval.py:36)
            loss = F.cross_entropy(mixing * v_out + (1 - mixing) * w_out, y)
            steps_alpha = self.adaptive and bool(first_batch)
            first_batch.clear()
            wrt = [personal[k] for k in keys] + ([global_params[k] for k in keys] if steps_alpha else [])
            grads = torch.autograd.grad(loss, wrt)
            with torch.no_grad():
                for k, g in zip(keys, grads):
                    personal[k] -= lr * g
                if steps_alpha:  # FedTorch's alpha_update (flow_utils.py:240-250), v and w after their steps
                    slope = 0.02 * alpha
                    for k, g_v, g_w in zip(keys, grads, grads[len(keys):]):
                        slope = slope + ((personal[k] - global_params[k]) * (alpha * g_v + (1 - alpha) * g_w)).sum()
                    alpha.copy_((alpha - alpha_lr * slope).clamp(0, 1))

        steps = {"paper": personal_step, "pfllib": pfllib_step, "fedtorch": fedtorch_step}
        losses = ctx.sgd(PARTS["full"], ctx.local_epochs, after_step=steps[self.params.variant])
        ctx.commit_model()
        if self.params.variant == "fedtorch":  # the w its output mixture is scored with, before aggregation
            ctx.set_slot("local_model", ctx.pack("full"))
        if self.params.variant == "pfllib":  # v becomes the mixture, the model the client is scored with
            with torch.no_grad():
                for k in keys:
                    personal[k] = alpha * personal[k] + (1 - alpha) * global_params[k]
        ctx.set_slot("personal_model", ctx.vector("full", {k: t.detach() for k, t in personal.items()}))
        ctx.set_slot("alpha", [float(alpha.detach())])
        ctx.record("apfl_alpha", float(alpha.detach()))  # 0: scored as the global model; 1: as its personal one
        return losses

    @property
    def adaptive(self) -> bool:
        return bool(self.params.adaptive)  # null resolved by APFLParams for the variant

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
        if self.params.variant == "fedtorch":
            local = ctx.slot("local_model", default=())
            if local.size:  # the client's own w; the global model before its first round
                ctx.unpack("full", local)
            ctx.score_with(_output_mixture(ctx.net, personal, alpha), on="network")
            return
        with torch.no_grad():
            for k, w in ctx.net.named_parameters():
                w.copy_(alpha * personal[k] + (1 - alpha) * w)

    @staticmethod
    def _personal_model(ctx: ClientContext) -> np.ndarray:
        return ctx.slot("personal_model", default=ctx.initial("full"))


def _output_mixture(net: torch.nn.Module, personal: dict[str, torch.Tensor], alpha: float) -> LogitAdjustment:
    """alpha v(x) + (1 - alpha) w(x) in place of w's logits, v's from the same network run with v's parameters
    (FedTorch's inference_personal, comms/utils/eval.py:31-39); v is held fixed (its logits carry no gradient)."""
    import torch

    inside: list[bool] = []  # v's forward runs the same network: its own hook call passes v's logits through

    def mixed(x: torch.Tensor, w_logits: torch.Tensor) -> torch.Tensor:
        if inside:
            return w_logits
        inside.append(True)
        try:
            with torch.no_grad():  # w's BatchNorm statistics stay w's own
                scratch = {k: b.clone() for k, b in net.named_buffers()}
                v_logits: torch.Tensor = torch.func.functional_call(net, {**personal, **scratch}, (x,))
        finally:
            inside.pop()
        return alpha * v_logits + (1 - alpha) * w_logits

    return mixed
