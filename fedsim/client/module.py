"""The client: a LightningModule with one optimizer for the base (body) and one for the head.

Contract the engine relies on (a user's own module meets it by subclassing ``FedClient`` or by
providing the same members):

* ``net``: an ``nn.Module`` whose ``state_dict`` keys the engine splits into body and head;
* ``part_keys``: ``{"body": [...], "head": [...]}`` state-dict keys of ``net`` per part;
* ``trainable``: a set of part names; the engine sets it before each local phase and
  ``training_step`` must update only those parts;
* ``proximal``: ``None`` or ``(coefficient, [(parameter, anchor tensor)])``; when set, the loss gets
  ``coefficient / 2 * sum ||parameter - anchor||^2`` (FedProx, Ditto);
* ``configure_optimizers()`` returns one optimizer per non-empty part, in ``OPTIMIZED_PARTS`` order,
  with ``automatic_optimization = False`` (manual optimization);
* ``training_step(batch, batch_idx)`` returns the loss; ``evaluate_batch(batch)`` returns
  the summed loss and updates ``self.accuracy`` (a torchmetrics metric).
"""
from __future__ import annotations

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import nn
from torch.nn import functional as F

from fedsim.config import OptimConfig

OPTIMIZED_PARTS = ("body", "head")


class FedClient(pl.LightningModule):
    def __init__(self, net: nn.Module, head_keys: list[str], num_classes: int,
                 body_optim: OptimConfig, head_optim: OptimConfig):
        super().__init__()
        self.automatic_optimization = False
        self.net = net
        head = set(head_keys)
        self.part_keys = {
            "body": [k for k in net.state_dict() if k not in head],
            "head": [k for k in net.state_dict() if k in head],
        }
        self._optim_cfg = {"body": body_optim, "head": head_optim}
        named = dict(net.named_parameters())
        self._part_params = {part: [named[k] for k in keys if k in named] for part, keys in self.part_keys.items()}
        self.optimized_parts = [p for p in OPTIMIZED_PARTS if self._part_params[p]]
        self.trainable: set[str] = set(self.optimized_parts)
        # Proximal pull toward reference weights (FedProx's mu, Ditto's lambda): (coefficient, [(param, anchor)]).
        self.proximal: tuple[float, list[tuple[nn.Parameter, torch.Tensor]]] | None = None
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self._part_params[p], lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
            for p in self.optimized_parts
            for c in [self._optim_cfg[p]]
        ]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        active = [opt for part, opt in zip(self.optimized_parts, self._as_list(self.optimizers()))
                  if part in self.trainable]
        loss = F.cross_entropy(self(x), y)
        if self.proximal is not None:
            coef, pairs = self.proximal
            loss = loss + coef / 2 * sum(((p - a) ** 2).sum() for p, a in pairs)
        for opt in active:
            opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        for opt in active:
            opt.step()
        return loss.detach()

    @torch.no_grad()
    def evaluate_batch(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Summed loss of the batch; accuracy accumulates in ``self.accuracy``."""
        x, y = batch
        logits = self(x)
        self.accuracy.update(logits, y)
        return float(F.cross_entropy(logits, y, reduction="sum"))

    @staticmethod
    def _as_list(opts) -> list:
        return opts if isinstance(opts, list) else [opts]
