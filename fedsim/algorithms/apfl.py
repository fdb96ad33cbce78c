from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from fedsim.algorithms.base import FEDAVG, LOCAL, PARTS, MechanismState, Params, PartialSharing
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext, LogitAdjustment


ALPHA_OFF = 0.01  # alpha this close to 0 or 1: the mixture is one of its two models


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
    without_batchnorm = ("apfl runs its personal model v on BatchNorm statistics of its own, apart from w's, and this "
                         "model has none: v and w differ in their weights alone, mixed by alpha as usual")
    # Deng et al. 2020 (APFL), Sec. 6: the experiments run alpha in {0.25, 0.5, 0.75}.
    tunable = {"alpha": Distribution(choice=[0.25, 0.5, 0.75])}
    Params = APFLParams
    params: APFLParams
    # local_model: fedtorch's w as the client's training left it, the w its output mixture is scored with
    client_slots = {"personal_model": "full", "alpha": 1, "local_model": "full"}
    packable = False  # its mixed forward runs the module itself (ctx.net) and learns alpha after every step

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch

        ctx.load()
        global_params = dict(ctx.net.named_parameters())
        personal = ctx.tensors("full", self._personal_model(ctx))
        keys = [k for k in personal if k in global_params]
        for k in keys:
            personal[k].requires_grad_()
        alpha = torch.tensor(float(ctx.slot("alpha", default=[self.start_alpha])[0]), requires_grad=True)
        lr = ctx.learning_rates("full").max()
        mixture = _Mixture(ctx.net, dict(ctx.net.named_buffers()), personal, keys, global_params, alpha, lr,
                           lr if self.params.alpha_lr is None else self.params.alpha_lr, self.adaptive)
        variant = _VARIANTS[self.params.variant](mixture)
        losses = ctx.sgd(PARTS["full"], ctx.local_epochs, after_step=variant.after_step)
        ctx.commit_model()
        variant.finish(ctx)
        ctx.set_slot("personal_model", ctx.vector("full", {k: t.detach() for k, t in personal.items()}))
        ctx.set_slot("alpha", [float(alpha.detach())])
        ctx.record("apfl_alpha", float(alpha.detach()))  # 0: scored as the global model; 1: as its personal one
        return losses

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        """alpha at 0 scores the global model alone (FedAvg); at 1 the personal model v alone, which trains on the
        client's data only (local training)."""
        if "apfl_alpha" not in final:
            return None
        alpha = final["apfl_alpha"]
        flag = FEDAVG if alpha <= ALPHA_OFF else LOCAL if alpha >= 1 - ALPHA_OFF else None
        return MechanismState(f"alpha {alpha:.3g}", flag)

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
        with torch.no_grad():  # the mixture's statistics too: v's own mixed with w's as its weights are
            for k, w in [*ctx.net.named_parameters(), *ctx.net.named_buffers()]:
                if k in personal and w.is_floating_point() and not k.endswith("num_batches_tracked"):
                    w.copy_(alpha * personal[k] + (1 - alpha) * w)

    @staticmethod
    def _personal_model(ctx: ClientContext) -> np.ndarray:
        return ctx.slot("personal_model", default=ctx.initial("full"))


@dataclass
class _Mixture:
    """A client's round of APFL: its personal model v (``personal``; ``keys`` its parameters), the global model w the
    network trains (``w``: its parameters, stepped by the local loop), the mixing weight alpha and their step sizes."""
    net: torch.nn.Module
    buffers: dict[str, torch.Tensor]  # the network's, as the round found them
    personal: dict[str, torch.Tensor]
    keys: list[str]
    w: Mapping[str, torch.Tensor]
    alpha: torch.Tensor
    lr: float
    alpha_lr: float
    adaptive: bool

    def forward(self, parameters: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """v's output: the network with ``parameters`` (v's, or the mixture's) in place of its own, on v's own BatchNorm
        statistics, which its training passes update as a model of its own (PFLlib's and FedTorch's v is a separate
        network): w's statistics stay w's own."""
        import torch

        out: torch.Tensor = torch.func.functional_call(self.net, {**parameters, **self.v_buffers()}, (x,))
        return out

    def forward_w(self, x: torch.Tensor) -> torch.Tensor:
        """w's output on a copy of its statistics (its own step already moved them on this batch)."""
        import torch

        scratch = {k: b.clone() for k, b in self.buffers.items()}
        out: torch.Tensor = torch.func.functional_call(self.net, scratch, (x,))
        return out

    def v_buffers(self) -> dict[str, torch.Tensor]:
        return {k: t for k, t in self.personal.items() if k in self.buffers}

    def v(self) -> list[torch.Tensor]:
        return [self.personal[k] for k in self.keys]

    def step_v(self, grads: Sequence[torch.Tensor]) -> None:
        """v's plain SGD step at the round's lr (the first ``len(keys)`` of ``grads`` are v's)."""
        for k, g in zip(self.keys, grads):
            self.personal[k] -= self.lr * g

    def alpha_slope(self, g_v: Sequence[torch.Tensor], g_w: Sequence[torch.Tensor]) -> torch.Tensor:
        """PFLlib's and FedTorch's gradient of alpha (FedTorch's alpha_update, flow_utils.py:240-250), v and w after
        their steps: <v - w, alpha grad_v + (1 - alpha) grad_w> + 0.02 alpha."""
        alpha = self.alpha
        slope = 0.02 * alpha
        for k, gv, gw in zip(self.keys, g_v, g_w):
            slope = slope + ((self.personal[k] - self.w[k]) * (alpha * gv + (1 - alpha) * gw)).sum()
        return slope

    def step_alpha(self, gradient: torch.Tensor) -> None:
        self.alpha.copy_((self.alpha - self.alpha_lr * gradient).clamp(0, 1))


class _Paper:
    """Algorithm 1 of Deng et al.: after each step of w on a batch, v (through the mixture) and alpha on the same
    batch. Algorithm 1 steps w, v and alpha from one iterate: v's and alpha's gradients are taken at the mixture with
    w as it was before its step on the batch. Mixed with w after that step, w would fit every batch better than v
    does, and alpha's gradient <v - w, grad> would push it to 0 (APFL scoring as FedAvg)."""

    def __init__(self, m: _Mixture):
        self.m = m
        self.before = {k: m.w[k].detach().clone() for k in m.keys}  # w before its step on the batch

    def after_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        import torch
        from torch.nn import functional as F

        m = self.m
        mixed = {k: m.alpha * m.personal[k] + (1 - m.alpha) * self.before[k] for k in m.keys}
        grads = torch.autograd.grad(F.cross_entropy(m.forward(mixed, x), y), m.v() + [m.alpha])
        with torch.no_grad():
            m.step_v(grads)
            if m.adaptive:
                m.step_alpha(grads[-1])
            for k in m.keys:
                self.before[k].copy_(m.w[k])

    def finish(self, ctx: ClientContext) -> None:
        """Nothing beyond v and alpha, which the hook keeps."""


class _PFLlib:
    """PFLlib's clientapfl.py: after w's step on the batch, v's own step on v's own loss, then alpha's with w's
    gradient of that step; at the round's end v becomes the mixture, the model the client is scored with."""

    def __init__(self, m: _Mixture):
        self.m = m

    def after_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        import torch
        from torch.nn import functional as F

        m = self.m
        grads = torch.autograd.grad(F.cross_entropy(m.forward(m.personal, x), y), m.v())
        with torch.no_grad():
            m.step_v(grads)
            if m.adaptive:  # v and w after their steps, their gradients before
                m.step_alpha(m.alpha_slope(grads, [self._w_grad(k) for k in m.keys]))

    def _w_grad(self, key: str) -> torch.Tensor:
        grad = self.m.w[key].grad
        assert grad is not None, "apfl (pfllib): w's gradient of its step is gone"
        return grad

    def finish(self, ctx: ClientContext) -> None:
        import torch

        m = self.m
        with torch.no_grad():
            for k in m.keys:
                m.personal[k] = m.alpha * m.personal[k] + (1 - m.alpha) * m.w[k]


class _FedTorch:
    """The authors' FedTorch: after w's step on the batch, v's step on the loss of the mixed outputs, w's output
    from w after its step; alpha stepped on a round's first batch only (centered/apfl.py:114), with both gradients
    of the mixed loss. The w its output mixture is scored with is kept, before aggregation."""

    def __init__(self, m: _Mixture):
        self.m = m
        self.first_batch = True

    def after_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        import torch
        from torch.nn import functional as F

        m = self.m
        mixing = m.alpha.detach()  # a constant of the loss: FedTorch's alpha is a float (eval.py:36)
        loss = F.cross_entropy(mixing * m.forward(m.personal, x) + (1 - mixing) * m.forward_w(x), y)
        steps_alpha, self.first_batch = m.adaptive and self.first_batch, False
        grads = torch.autograd.grad(loss, m.v() + ([m.w[k] for k in m.keys] if steps_alpha else []))
        with torch.no_grad():
            m.step_v(grads)
            if steps_alpha:
                m.step_alpha(m.alpha_slope(grads, grads[len(m.keys):]))

    def finish(self, ctx: ClientContext) -> None:
        ctx.set_slot("local_model", ctx.pack("full"))


_VARIANTS: dict[str, type[_Paper | _PFLlib | _FedTorch]] = {"paper": _Paper, "pfllib": _PFLlib, "fedtorch": _FedTorch}


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
            with torch.no_grad():  # v on its own BatchNorm statistics, w's untouched
                v_logits: torch.Tensor = torch.func.functional_call(net, personal, (x,))
        finally:
            inside.pop()
        return alpha * v_logits + (1 - alpha) * w_logits

    return mixed
