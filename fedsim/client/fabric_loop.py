"""Lightning's fit loop run by fedsim over Fabric (model.client_loop: fabric, the default): epochs of
``training_step`` with the module's hooks and callbacks, automatic optimization, and its lr schedulers."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytorch_lightning as pl
import torch

from fedsim.algorithms.context import StepCallback
from fedsim.client.fabric import FedsimFabric
from fedsim.client.hooks import UserCode
from fedsim.client.logged import LoggedValues
from fedsim.client.optimizers import OptimizerSet
from fedsim.errors import UserCodeError

Batch = tuple[torch.Tensor, torch.Tensor]


def returned_loss(out: Any, module: pl.LightningModule) -> Any:
    """The loss a training_step returned under automatic optimization: itself, or a dict's "loss" (a dict without
    one is refused, as Lightning refuses it); None skips the step."""
    if not isinstance(out, Mapping):
        return out
    if out.get("loss") is None:
        raise UserCodeError(f"model.client: {type(module).__name__}.training_step returned a dict without a 'loss' "
                            "key; return the loss, or a dict holding it under 'loss'")
    return out["loss"]


class FabricLoop:
    """One local update as Lightning's fit loop, its steps backpropagated through the module's Fabric."""

    def __init__(self, module: pl.LightningModule, fabric: FedsimFabric, user: UserCode, logged: LoggedValues):
        self.module, self.fabric, self.user, self.logged = module, fabric, user, logged
        self.automatic = module.automatic_optimization

    def run(self, active: OptimizerSet, epoch_batches: Callable[[], Iterable[Batch]], epochs: int,
            after_step: StepCallback | None) -> tuple[list[torch.Tensor], int]:
        """Lightning's fit loop over the module, its hooks and callbacks: (per-step losses, steps)."""
        losses: list[torch.Tensor] = []
        steps = 0
        call = self.user.call
        call("on_fit_start")
        call("on_train_start")
        for epoch in range(epochs):
            self.fabric.current_epoch = epoch
            call("on_train_epoch_start")
            for batch_idx, batch in enumerate(epoch_batches()):
                loss = self._step(active, batch, batch_idx)
                steps += 1
                if loss is not None:
                    losses.append(loss)
                if after_step is not None:
                    after_step(*batch)
            call("on_train_epoch_end")
            self._step_schedulers(active, "epoch", epoch + 1)
        call("on_train_end")
        call("on_fit_end")
        return losses, steps

    def _step(self, active: OptimizerSet, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        f = self.fabric
        f.step_loss = None
        self.logged.batch_size = len(batch[1])
        self.user.call("on_train_batch_start", batch, batch_idx)
        with f.autocast():
            out = self.user.run("training_step", self.module.training_step, batch, batch_idx)
        if self.automatic:
            loss = returned_loss(out, self.module)
            if loss is not None:  # Lightning skips the optimizer step of a training_step that returns None
                self._optimize(active, loss)
        self.user.call("on_train_batch_end", out, batch, batch_idx)
        f.global_step += 1
        self._step_schedulers(active, "step", f.global_step)
        return f.step_loss

    def _optimize(self, active: OptimizerSet, loss: torch.Tensor) -> None:
        """Lightning's automatic optimization: zero_grad, backward, step; of the module's one optimizer, or of
        fedsim's one per part for a module without configure_optimizers."""
        for opt in active.wrapped:
            opt.zero_grad(set_to_none=True)
        self.fabric.backward(loss)
        for opt in active.wrapped:
            self.user.call("on_before_optimizer_step", opt)
            opt.step()

    def _step_schedulers(self, active: OptimizerSet, interval: str, count: int) -> None:
        for entry in active.schedulers:
            if entry["interval"] == interval and count % entry["frequency"] == 0:
                self.user.run("lr_scheduler.step", entry["scheduler"].step)
