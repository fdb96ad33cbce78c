"""A local update as one ``pl.Trainer.fit`` (model.client_loop: trainer): the Trainer runs the loop, hooks and
callbacks; fedsim hands it the update's optimizers and its batches, and puts the penalty into every backward
pass through the Fabric's :meth:`~fedsim.client.fabric.FedsimFabric.penalized`."""
from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pytorch_lightning as pl
import torch
import torchmetrics
from pytorch_lightning.callbacks import ModelCheckpoint

from fedsim.algorithms.context import StepCallback
from fedsim.client.fabric import FedsimFabric
from fedsim.client.fabric_loop import Batch, returned_loss
from fedsim.client.hooks import UserCode
from fedsim.client.logged import LoggedValues
from fedsim.client.optimizers import OptimizerSet
from fedsim.config.learning import Precision


class _Batches:
    """Iterated once per epoch, as a DataLoader would be."""

    def __init__(self, epoch_batches: Callable[[], Iterable[Batch]]):
        self.epoch_batches = epoch_batches

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.epoch_batches())


class TrainerLoop:
    """One local update as a fresh Trainer's fit of the module."""

    def __init__(self, module: pl.LightningModule, fabric: FedsimFabric, user: UserCode, logged: LoggedValues,
                 listed: list[pl.Callback], precision: Precision, root: str | None = None):
        self.module, self.fabric, self.user, self.logged = module, fabric, user, logged
        # model.callbacks, as built: each fit gets fresh copies, as a fresh Trainer with fresh callbacks (an
        # EarlyStopping's best score is one local update's); a Trainer asks the module for its own callbacks itself.
        self.listed = listed
        self.precision = precision  # model.precision
        self.root = root  # the Trainer's default_root_dir: where Lightning's callbacks write

    def run(self, active: OptimizerSet, epoch_batches: Callable[[], Iterable[Batch]], epochs: int,
            after_step: StepCallback | None) -> tuple[list[torch.Tensor], int]:
        """The fit: (per-step losses, steps)."""
        module, f = self.module, self.fabric
        losses: list[torch.Tensor] = []
        steps = 0
        step, backward = module.training_step, module.manual_backward

        def training_step(batch: Batch, batch_idx: int) -> Any:
            nonlocal steps
            f.step_loss, steps = None, steps + 1
            self.logged.batch_size = len(batch[1])
            out = step(batch, batch_idx)
            if not module.automatic_optimization:
                loss = f.step_loss
            elif isinstance(out, Mapping):
                out, loss = {**out, "loss": f.penalized(returned_loss(out, module))}, f.step_loss
            else:
                out, loss = (None, None) if out is None else (f.penalized(out), f.step_loss)
            if loss is not None:
                losses.append(loss)
            if after_step is not None:
                after_step(*batch)
            return out

        listed = [copy.deepcopy(cb) for cb in self.listed]
        trainer = pl.Trainer(max_epochs=epochs, accelerator=f.device.type, devices=1, precision=self.precision,
                             logger=False, callbacks=listed, default_root_dir=self.root,
                             enable_checkpointing=any(isinstance(cb, ModelCheckpoint) for cb in listed),
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             limit_val_batches=0)
        saved = module._fabric, module._trainer
        # This fit's own step, backward and optimizers, set on the instance over the class's methods, deleted after.
        overridden: dict[str, Callable[..., Any]] = {
            "training_step": training_step,
            "manual_backward": lambda loss, *a, **k: backward(f.penalized(loss), *a, **k),
            "configure_optimizers": active.with_schedulers, **self._logging_to_both()}
        before = {name: module.__dict__[name] for name in overridden if name in module.__dict__}
        for name, method in overridden.items():
            setattr(module, name, method)
        module._fabric = None  # the Trainer's strategy, not Fabric's, steps and backpropagates in this fit
        try:
            with warnings.catch_warnings():  # fedsim scores clients itself: a Trainer without validation data is meant
                warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
                self.user.run("Trainer.fit", trainer.fit, module, _Batches(epoch_batches))
        finally:
            module._fabric, module._trainer = saved
            for name in overridden:
                del module.__dict__[name]
            module.__dict__.update(before)
        return losses, steps

    def _logging_to_both(self) -> dict[str, Callable[..., Any]]:
        """``self.log`` into fedsim's records and the Trainer's too: its callbacks (EarlyStopping, ModelCheckpoint)
        read what a module logs from ``trainer.callback_metrics``. A torchmetrics object stays fedsim's alone: the
        Trainer would compute and reset it at the epoch's end, under fedsim's records."""
        module, fedsim_log, fedsim_log_dict = self.module, self.module.log, self.module.log_dict

        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            fedsim_log(name, value, *args, **kwargs)
            if not isinstance(value, torchmetrics.Metric):
                pl.LightningModule.log(module, name, value, *args, **kwargs)

        def log_dict(dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
            fedsim_log_dict(dictionary, *args, **kwargs)
            numbers = {k: v for k, v in dict(dictionary).items() if not isinstance(v, torchmetrics.Metric)}
            if numbers:
                pl.LightningModule.log_dict(module, numbers, *args, **kwargs)

        return {"log": log, "log_dict": log_dict}
