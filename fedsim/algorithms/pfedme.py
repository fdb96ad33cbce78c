"""pFedMe: T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020
(arXiv 2006.08848), Algorithm 1. Each client keeps a personal model theta, the (approximate) minimiser of its loss
plus a pull toward its local copy w of the global model; w moves toward theta, and the server averages the w's.

Client, per training batch D:
    K steps of the solver on  f(theta; D) + lambda/2 ||theta - w||^2   (step personal_lr; theta warm-started)
    w <- w - eta lambda (w - theta)                                      (eta: the run's train lr, per part)
theta starts each round at the received global model and carries from batch to batch, as in the authors' code and
PFLlib (clientpFedMe.py: the model is the solver's variable, reset to the global model by ``set_parameters``). The
solver is torch SGD with the run's momentum and weight decay (the paper and PFLlib take plain steps, i.e.
train.*.momentum 0; PFLlib's solver adds 0.001 theta, a weight decay). Only parameters take part in the pull and in
w's update; BatchNorm's running statistics are those theta's forward passes left, uploaded with w and kept with theta.

Server: w_global <- (1 - beta) w_global + beta mean(w), element by element.

theta, the whole model (statistics included), is kept per client and is the model the client is scored with; a
client that has not trained yet is scored with the global model, from which its theta would start.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import PARTS, Algorithm, Params
from fedsim.config.schema import Distribution
from fedsim.core.protocol import WEIGHTS

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext


class PFedMeParams(Params):
    lam: float = Field(15.0, gt=0, alias="lambda", description="lambda: the pull of theta toward w, lambda/2 "
                       "||theta - w||^2 (paper Sec. 5, MNIST: 15; PFLlib's command-line default is 1)")
    personal_lr: float = Field(0.01, gt=0, description="step of the K-step solver for theta (paper Sec. 5 and "
                               "PFLlib: 0.01)")
    K: int = Field(5, ge=1, description="solver steps per batch (paper Sec. 5 and PFLlib: 5)")
    # The paper also tries beta > 1 (an extrapolation); here that would extrapolate BatchNorm's running variances too,
    # which the element-wise server step cannot tell from weights and which can turn negative, so beta <= 1.
    # PFLlib's command-line default, 0, never moves the global model.
    beta: float = Field(1.0, gt=0, le=1, description="server mixing: (1 - beta) w_global + beta mean(w); 1: the "
                        "plain average (paper Sec. 5)")


class PFedMe(Algorithm):
    """a personal model solved against a Moreau-envelope pull, the local model moved toward it (T. Dinh et al. 2020)"""
    name, train, share = "pfedme", "full", "full"
    # T. Dinh et al. 2020 (pFedMe, NeurIPS), Sec. 5: lambda 15 (MNIST) or 20 (Synthetic) and the personal lr of
    # each setting (0.1, 0.01), drawn independently; K stays at the paper's 5.
    tunable = {"lambda": Distribution(choice=[15.0, 20.0]), "personal_lr": Distribution(choice=[0.01, 0.1])}
    Params = PFedMeParams
    params: PFedMeParams
    client_slots = {"personal_model": "full"}
    own_objective = "inner Moreau-envelope problem per batch"
    packable = False  # its steps run the network itself (ctx.net)
    server_update_by_tensor = True  # element by element

    def epochs_per_round(self, local_epochs: int) -> int:
        return self.params.K * local_epochs  # K forward and backward passes per batch

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch
        from torch.nn import functional as F

        p = self.params
        ctx.load()
        ctx.net.train()
        groups = ctx.param_groups(PARTS["full"])
        # (theta: the live parameter, w: the local model, eta: its part's training lr)
        local = [(theta, theta.detach().clone(), group["lr"]) for group in groups for theta in group["params"]]
        for group in groups:
            group["lr"] = p.personal_lr
        solver = torch.optim.SGD(groups)
        losses = []
        for x, y in ctx.batches(ctx.local_epochs):
            for _ in range(p.K):
                solver.zero_grad()
                loss = F.cross_entropy(ctx.net(x), y)
                loss.backward()
                with torch.no_grad():
                    for theta, w, _ in local:
                        theta.grad.add_(theta - w, alpha=p.lam)  # the gradient of lambda/2 ||theta - w||^2
                solver.step()
                losses.append(loss.detach())
            with torch.no_grad():
                for theta, w, eta in local:
                    w.sub_(eta * p.lam * (w - theta))
        ctx.set_slot("personal_model", ctx.pack("full"))
        with torch.no_grad():
            for theta, w, _ in local:
                theta.copy_(w)
        ctx.commit_model()  # w and the statistics theta's passes left
        return losses

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
