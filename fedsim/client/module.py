"""The client: a LightningModule with one optimizer for the base (body) and one for the head.

The user writes the objective (``loss``); the framework owns the loop. Contract the engine relies
on (a user's own module meets it by subclassing ``FedClient`` and overriding ``loss``):

* ``net``: an ``nn.Module`` whose ``state_dict`` keys the engine splits into body and head;
* ``part_keys``: ``{"body": [...], "head": [...]}`` state-dict keys of ``net`` per part;
* ``configure_optimizers()`` returns one optimizer per non-empty part, in ``optimized_parts`` order
  (manual optimization); ``build_optimizer(part, settings)`` makes another one for a part
  (evaluation fine-tuning has its own settings);
* before each local phase the engine sets ``active_optimizers`` (the parts that train) and
  ``penalty`` (``None`` or a callable giving the algorithm's extra loss term: FedProx's proximal pull,
  Ditto's anchor, SCAFFOLD's correction); ``training_step`` adds it to ``loss``, so a module that
  changes the loss keeps every algorithm working;
* ``evaluate_batch(batch)`` returns the summed loss and updates ``self.accuracy`` (a torchmetrics metric).
"""
from __future__ import annotations

from collections.abc import Callable

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import nn
from torch.nn import functional as F

from fedsim.config import ConfigError, OptimConfig
from fedsim.plugins import load_plugin

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
        self.active_optimizers: list[torch.optim.Optimizer] = []
        self.penalty: Callable[[], torch.Tensor] | None = None
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The local objective; override to change it."""
        x, y = batch
        return F.cross_entropy(self(x), y)

    def build_optimizer(self, part: str, settings: OptimConfig) -> torch.optim.Optimizer:
        params = self._part_params[part]
        if settings.optimizer == "adam":
            return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)
        return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.build_optimizer(p, self._optim_cfg[p]) for p in self.optimized_parts]

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        if self.penalty is not None:
            loss = loss + self.penalty()
        for opt in self.active_optimizers:
            opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        for opt in self.active_optimizers:
            opt.step()
        return loss.detach()

    @torch.no_grad()
    def evaluate_batch(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Summed loss of the batch; accuracy accumulates in ``self.accuracy``."""
        x, y = batch
        logits = self(x)
        self.accuracy.update(logits, y)
        return float(F.cross_entropy(logits, y, reduction="sum"))


def load_client_class(path: str | None) -> type[FedClient]:
    """``model.client``: a user's LightningModule meeting FedClient's contract; FedClient by default."""
    if path is None:
        return FedClient
    try:
        return load_plugin(path, "model.client")
    except ValueError as err:
        raise ConfigError(str(err)) from None
