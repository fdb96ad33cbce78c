"""pFedMe: T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020
(arXiv 2006.08848), Algorithm 1. Each client keeps a personal model theta, the (approximate) minimiser of its loss
plus a pull toward its local copy w of the global model; w moves toward theta, and the server averages the w's.

Client, per training batch D (``local_steps`` batches a round):
    K plain steps on  f(theta; D) + lambda/2 ||theta - w||^2 + mu/2 ||theta||^2   (step personal_lr; warm-started)
    w <- w - min(eta lambda, step_limit) (w - theta)                               (eta: the run's train lr, per part)
theta starts each round at the received global model and carries from batch to batch, as in the authors' code and
PFLlib (clientpFedMe.py: the model is the solver's variable, reset to the global model by ``set_parameters``). The
solver is the authors' pFedMeOptimizer (CharlieDinh/pFedMe FLAlgorithms/optimizers/fedoptimizer.py:50, 64): plain
steps, no momentum whatever the run's optimizer says, with its mu = 0.001 decay of theta (PFLlib's too). A round is
``local_steps`` batches, the authors' count: their ``--local_epochs 20`` draws one batch per "local epoch"
(FLAlgorithms/users/userpFedMe.py:39-42, ``get_next_train_batch``, cycling through the data). Defaults: one setting of
the authors', their main.py's (lines 71, 73, 77, 78 = README.md:71, MNIST with the dnn): lambda 15, personal lr 0.09,
K 5, 20 local steps (their lr 0.005 is the run's train lr here). Only parameters take part in the pull and in w's
update; BatchNorm's running statistics are those theta's forward passes left, uploaded with w and kept with theta.

eta lambda is the share of the gap to theta that w closes each batch: the authors keep it at or below 0.15 (README.md:
MNIST lr 0.005 x lambda 15 = 0.075, Synthetic 0.005 x 20 = 0.1, CIFAR-10 0.01 x 15 = 0.15); past 1 w overshoots theta.
A search drawing the run's lr for every method alike would put pFedMe far outside (the leaderboard's chosen lr x
lambda was 1.43), so the step is clamped to ``step_limit`` (0.15) and ``--dry-run`` says so in one line.

Server: w_global <- (1 - beta) w_global + beta mean(w), element by element.

theta, the whole model (statistics included), is kept per client and is the model the client is scored with; a
client that has not trained yet is scored with the global model, from which its theta would start.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import FEDAVG, PARTS, Algorithm, MechanismState, Params
from fedsim.config.learning import TrainConfig
from fedsim.config.schema import Distribution
from fedsim.core.protocol import WEIGHTS

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext


DISTANCE_OFF = 1e-3  # ||theta - w|| below this: the personal model is the local copy of the global one


class PFedMeParams(Params):
    lam: float = Field(15.0, gt=0, alias="lambda", description="lambda: the pull of theta toward w, lambda/2 "
                       "||theta - w||^2 (the authors' main.py:71 and README.md:71: 15)")
    personal_lr: float = Field(0.09, gt=0, description="step of the K-step solver for theta (the authors' main.py:78 "
                               "and README.md:71, with lambda 15: 0.09)")
    K: int = Field(5, ge=1, description="solver steps per batch (the authors' main.py:77: 5)")
    local_steps: int | None = Field(20, ge=1, description="batches a round, the authors' count of their "
                                    "--local_epochs (main.py:73: 20); null: train.local_epochs passes over the data")
    mu: float = Field(0.001, ge=0, description="the solver's decay of theta, + mu theta in its gradient (the authors' "
                      "pFedMeOptimizer, fedoptimizer.py:50)")
    step_limit: float = Field(0.15, gt=0, le=1, description="the most eta x lambda (train lr x lambda) w's move toward "
                              "theta takes; a larger product is clamped to it (the authors' runs: 0.075 to 0.15)")
    # The paper also tries beta > 1 (an extrapolation); here that would extrapolate BatchNorm's running variances too,
    # which the element-wise server step cannot tell from weights and which can turn negative, so beta <= 1.
    # PFLlib's command-line default, 0, never moves the global model.
    beta: float = Field(1.0, gt=0, le=1, description="server mixing: (1 - beta) w_global + beta mean(w); 1: the "
                        "plain average (the authors' README.md:71)")


class PFedMe(Algorithm):
    """a personal model solved against a Moreau-envelope pull, the local model moved toward it (T. Dinh et al. 2020)"""
    name, train, share = "pfedme", "full", "full"
    # The authors' runs (CharlieDinh/pFedMe README.md:42-138): lambda 15, 20 or 30 and personal lr 0.01, 0.05, 0.09
    # or 0.1 across MNIST, Synthetic and CIFAR-10, drawn independently; K stays at their 5.
    tunable = {"lambda": Distribution(choice=[15.0, 20.0, 30.0]),
               "personal_lr": Distribution(choice=[0.01, 0.05, 0.09, 0.1])}
    Params = PFedMeParams
    params: PFedMeParams
    client_slots = {"personal_model": "full"}
    own_objective = "inner Moreau-envelope problem per batch"
    packable = False  # its steps run the network itself (ctx.net)
    server_update_by_tensor = True  # element by element
    # The solver's and w's steps are plain gradient steps (the authors' pFedMeOptimizer): no momentum reaches them.
    unused_settings = frozenset({"momentum"})

    def pull(self, eta: float) -> float:
        """The share of the gap to theta w closes per batch: eta lambda, at most ``step_limit``."""
        return min(eta * self.params.lam, self.params.step_limit)

    def settings_notice(self, train: TrainConfig) -> str | None:
        lr = max(train.body.lr, train.head.lr)
        if self.pull(lr) == lr * self.params.lam:
            return None
        return (f"pfedme: train lr {lr:g} x lambda {self.params.lam:g} = {lr * self.params.lam:.3g} is above the "
                f"authors' range; w's step toward theta is clamped to algorithm.step_limit {self.params.step_limit:g}")

    def epochs_per_round(self, local_epochs: int) -> int:
        """K forward and backward passes per batch; with ``local_steps``, K passes' worth: the dry run's count then
        takes a pass as about local_steps batches (it counts passes, not batches)."""
        return self.params.K * (local_epochs if self.params.local_steps is None else 1)

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch
        from torch.nn import functional as F

        p = self.params
        ctx.load()
        ctx.net.train()
        # (theta: the live parameter, w: the local model, eta: its part's training lr)
        local = [(theta, theta.detach().clone(), group["lr"]) for group in ctx.param_groups(PARTS["full"])
                 for theta in group["params"]]
        thetas = [theta for theta, _, _ in local]
        losses = []
        for x, y in self._batches(ctx):
            for _ in range(p.K):
                loss = F.cross_entropy(ctx.net(x), y)
                grads = torch.autograd.grad(loss, thetas)
                with torch.no_grad():  # a plain step on f + lambda/2 ||theta - w||^2 + mu/2 ||theta||^2
                    for (theta, w, _), g in zip(local, grads):
                        theta.sub_(p.personal_lr * (g + p.lam * (theta - w) + p.mu * theta))
                losses.append(loss.detach())
            with torch.no_grad():
                for theta, w, eta in local:
                    w.sub_(self.pull(eta) * (w - theta))
        personal = ctx.pack("full")
        ctx.set_slot("personal_model", personal)
        with torch.no_grad():
            for theta, w, _ in local:
                theta.copy_(w)
        # ||theta - w||: how far the personal model the client is scored with stands from its local copy of the
        # global model (0: pFedMe scores as FedAvg; lambda sets the pull).
        ctx.record("pfedme_distance", float(np.linalg.norm(personal.astype(np.float64) - ctx.pack("full"))))
        ctx.commit_model()  # w and the statistics theta's passes left
        return losses

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        """theta at w: the client is scored with its copy of the global model (FedAvg)."""
        if "pfedme_distance" not in final:
            return None
        distance = final["pfedme_distance"]
        return MechanismState(f"||theta - w|| {distance:.3g}", FEDAVG if distance < DISTANCE_OFF else None)

    def _batches(self, ctx: ClientContext) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``local_steps`` batches, passes over the data drawn one after another as needed (the authors'
        get_next_train_batch cycles its loader), or train.local_epochs whole passes."""
        steps = self.params.local_steps
        if steps is None:
            return ctx.batches(ctx.local_epochs)
        return itertools.islice(ctx.batches(steps), steps)  # a pass holds at least one batch; drawn lazily

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        ctx.load()
        ctx.unpack("full", ctx.slot("personal_model", default=ctx.pack("full")))

    def server_update(self, state: dict[str, np.ndarray], means: dict[str, np.ndarray], sampled: int,
                      num_clients: int) -> None:
        beta = self.params.beta
        if beta == 1:  # the average itself, bit for bit (no 0 * (w - mean) added, which can flip a zero's sign)
            state[WEIGHTS] = means[WEIGHTS].astype(np.float32)
            return
        mean = means[WEIGHTS]
        state[WEIGHTS] = ((1 - beta) * state[WEIGHTS].astype(np.float64) + beta * mean).astype(np.float32)
