"""Per-FedAvg: Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (arXiv 2002.07948), Algorithm 1 with the approximations of
Sec. 4 (first-order, FO, and Hessian-free, HF). The global model is a MAML initialisation: a client personalises it
with one gradient step of size alpha on its own data, so each local step descends the loss *after* that step,
f(w - alpha grad f(w)).

Local step (three batches D, D', D'' drawn in a row, two for FO):
    temp = w - alpha grad f(w; D)
    FO:  w <- w - beta grad f(temp; D')
    HF:  w <- w - beta (I - alpha H(w; D'')) grad f(temp; D')
Both steps are plain gradient steps (no momentum, no weight decay), as every reference takes them: the pFedMe
authors' Per-FedAvg (CharlieDinh/pFedMe FLAlgorithms/users/userperavg.py:39-71, MySGD in
FLAlgorithms/optimizers/fedoptimizer.py:4-24) and PFLlib's (clientperavg.py:22-72, PerAvgOptimizer). Defaults are
PFLlib's (TsingZ0/PFLlib system/flcore/clients/clientperavg.py:14, ``self.beta = self.learning_rate``, its
``args.beta`` commented out): FO, alpha = beta = the run's training lr (``beta: null``). A fixed beta is the pFedMe
authors' setting (README.md:44, 73, 83, 90: ``--algorithm PerAvg --learning_rate 0.005 --beta 0.001``): at 0.001
without momentum, 20 rounds are 200 meta-steps of 0.001, too few to leave the initialisation on CIFAR-100 (every
leaderboard trial at 14-18%), so beta is searched, beta = lr among its candidates. HF is the paper's better variant
in its Sec. 5.
The HF product H v is exact (autograd's double backward), the delta -> 0 limit of the paper's finite difference
[grad f(w + delta v) - grad f(w - delta v)] / 2 delta, so there is no delta to choose. The full model is shared and
averaged as in FedAvg.

Scoring (the paper's personalised model, PFLlib's ``train_one_step``): the received global model after one step of
size alpha on one training batch of the client.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedsim.algorithms.base import PARTS, Algorithm, Params
from fedsim.config.schema import Distribution

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext

Batch = tuple["torch.Tensor", "torch.Tensor"]


class PerFedAvgParams(Params):
    variant: Literal["fo", "hf"] = Field("fo", description="fo: first order, 2 batches a step (the pFedMe authors' "
                                         "and PFLlib's code); hf: with the exact Hessian-vector term, 3 batches a step "
                                         "(the paper's better variant, Sec. 5)")
    alpha: float | None = Field(None, gt=0, description="personalisation step size: the inner MAML step, and the one "
                                "step taken before scoring; null: the run's training lr of each part (the pFedMe "
                                "authors' and PFLlib's)")
    beta: float | None = Field(None, gt=0, description="the outer (meta) step size, a plain gradient step; null: "
                               "the run's training lr of each part (PFLlib's, clientperavg.py:14); the pFedMe authors "
                               "fix 0.001 (README.md:44)")


class PerFedAvg(Algorithm):
    """FedAvg of a MAML initialisation, scored after one personal gradient step (Fallah et al. 2020)"""
    name, train, share = "perfedavg", "full", "full"
    Params = PerFedAvgParams
    params: PerFedAvgParams
    # Outer step beta: PFLlib's beta = lr (null) and the pFedMe authors' fixed 0.001 with a decade between.
    tunable = {"beta": Distribution(choice=[None, 0.001, 0.01])}
    # Both steps are plain gradient steps: the run's momentum (and weight decay) never reach them.
    unused_settings = frozenset({"momentum"})
    own_objective = "MAML step through one personalisation step"
    packable = False  # its steps run the network itself (ctx.net)

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch

        ctx.load()
        ctx.net.train()
        params, alphas, betas = self._steps(ctx)
        losses = []
        for batches in self._step_batches(ctx):
            grads, loss = self.meta_gradient(ctx.net, params, alphas, batches)
            with torch.no_grad():
                for p, g, beta in zip(params, grads, betas):
                    p.sub_(beta * g)
            losses.append(loss)
        ctx.commit_model()
        return losses

    def _steps(self, ctx: ClientContext) -> tuple[list[torch.Tensor], list[float], list[float]]:
        """The trainable tensors, and per tensor its alpha and beta: the parameter's value, or its part's training lr
        this round (on its schedule) where the parameter is null."""
        params, alphas, betas = [], [], []
        for group in ctx.param_groups(PARTS["full"]):
            for p in group["params"]:
                params.append(p)
                alphas.append(group["lr"] if self.params.alpha is None else self.params.alpha)
                betas.append(group["lr"] if self.params.beta is None else self.params.beta)
        return params, alphas, betas

    def meta_gradient(self, net: torch.nn.Module, params: list[torch.Tensor], alphas: list[float],
                      batches: tuple[Batch, ...]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """grad f(temp; D') (FO), minus alpha H(w; D'') grad f(temp; D') (HF), with the network left at w; and the
        loss at temp, the objective Per-FedAvg descends."""
        import torch

        start = [p.detach().clone() for p in params]
        self.personal_step(net, params, alphas, *batches[0])  # temp = w - alpha grad f(w; D)
        loss = _loss(net, *batches[1])
        at_temp = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, w in zip(params, start):
                p.copy_(w)
        if self.params.variant == "fo":
            return list(at_temp), loss.detach()
        grads = torch.autograd.grad(_loss(net, *batches[2]), params, create_graph=True)
        hessian_times = torch.autograd.grad(grads, params, grad_outputs=at_temp)  # H(w; D'') grad f(temp; D')
        return [g - alpha * hv for g, hv, alpha in zip(at_temp, hessian_times, alphas)], loss.detach()

    @staticmethod
    def personal_step(net: torch.nn.Module, params: list[torch.Tensor], alphas: list[float], x: torch.Tensor,
                      y: torch.Tensor) -> None:
        """w <- w - alpha grad f(w; (x, y)): a plain gradient step, as the paper's personalisation."""
        import torch

        grads = torch.autograd.grad(_loss(net, x, y), params)
        with torch.no_grad():
            for p, g, alpha in zip(params, grads, alphas):
                p.sub_(alpha * g)

    def _step_batches(self, ctx: ClientContext) -> Iterator[tuple[Batch, ...]]:
        """Each epoch's batches in consecutive groups of 2 (FO) or 3 (HF), one group a step. An epoch's last group,
        if short, is completed with the epoch's first batches, so every sample trains each epoch and a client with
        fewer batches than a step needs still steps (PFLlib's drop_last loader would skip them)."""
        size = 2 if self.params.variant == "fo" else 3
        for _ in range(ctx.local_epochs):
            group: list[Batch] = []
            first: list[Batch] = []
            for batch in ctx.batches(1):
                group.append(batch)
                if len(first) < size - 1:
                    first.append(batch)
                if len(group) == size:
                    yield tuple(group)
                    group = []
            if group:
                yield tuple((group + first * size)[:size])

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        ctx.load()
        ctx.net.train()  # the step trains as local steps do (BatchNorm on the batch's statistics)
        x, y = next(ctx.batches(1))
        params, alphas, _ = self._steps(ctx)
        self.personal_step(ctx.net, params, alphas, x, y)


def _loss(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    from torch.nn import functional as F

    return F.cross_entropy(net(x), y)
