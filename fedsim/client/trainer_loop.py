"""A local update as one ``pl.Trainer.fit`` (model.client_loop: trainer): the Trainer runs the loop, hooks and
callbacks; fedsim hands it the update's optimizers and its batches, and puts the penalty into every backward
pass through the Fabric's :meth:`~fedsim.client.fabric.FedsimFabric.penalized`."""
from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning_fabric
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


WARNINGS_LOG = "warnings.log"  # in the Trainer's root: Lightning's own warnings, once each per worker
NO_VALIDATION = "no `val_dataloader`"  # a Trainer without validation data: meant, never logged
LIGHTNING_PACKAGES = (str(Path(pl.__file__ or "").parent), str(Path(lightning_fabric.__file__ or "").parent))


def _from_lightning(filename: str) -> bool:
    return filename.startswith(LIGHTNING_PACKAGES)


def name_checkpoints(listed: list[pl.Callback], at: Mapping[str, Any]) -> None:
    """A ModelCheckpoint without a filename of its own names its files by the client, the round and (for a local
    update training one part, or evaluation's fine-tuning) what it trained, then Lightning's epoch and step:
    ``client=3-round=2-{epoch}-{step}.ckpt``. A filename the user gave is kept as given."""
    stage = "" if at.get("stage", "training") == "training" else f"-{at['stage']}"
    parts = at.get("parts", [])
    part = f"-{parts[0]}" if len(parts) == 1 else ""
    for callback in listed:
        if isinstance(callback, ModelCheckpoint) and callback.filename is None:
            callback.filename = f"client={at.get('client')}-round={at.get('round')}{stage}{part}-{{epoch}}-{{step}}"


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
        self.logged_warnings: set[str] = set()  # what this worker wrote to warnings.log already
        self.shown: dict[Any, Any] = {}  # the module's own warnings already shown, as Python's registry keeps them

    def run(self, active: OptimizerSet, epoch_batches: Callable[[], Iterable[Batch]], epochs: int,
            after_step: StepCallback | None) -> tuple[list[torch.Tensor], int]:
        """The fit: (per-step losses, steps)."""
        module, f = self.module, self.fabric
        losses: list[torch.Tensor] = []
        steps = 0
        step = module.training_step

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
        name_checkpoints(listed, f.fedsim)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self._fit(module, listed, active, epoch_batches, epochs, training_step)
            finally:
                self._route(caught)
        return losses, steps

    def _fit(self, module: pl.LightningModule, listed: list[pl.Callback], active: OptimizerSet,
             epoch_batches: Callable[[], Iterable[Batch]], epochs: int,
             training_step: Callable[[Batch, int], Any]) -> None:
        f, backward = self.fabric, module.manual_backward
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
            self.user.run("Trainer.fit", trainer.fit, module, _Batches(epoch_batches))
        finally:
            module._fabric, module._trainer = saved
            for name in overridden:
                del module.__dict__[name]
            module.__dict__.update(before)

    def _route(self, caught: list[warnings.WarningMessage]) -> None:
        """Lightning's own warnings (a Trainer's deprecations, "Checkpoint directory ... exists", each repeated by
        every local update) go to the run's ``lightning/warnings.log``, each once per worker; any other warning
        (the module's own) is shown as Python would show it."""
        for caught_one in caught:
            if not _from_lightning(caught_one.filename):
                warnings.warn_explicit(caught_one.message, caught_one.category, caught_one.filename,
                                       caught_one.lineno, registry=self.shown)
                continue
            line = f"{caught_one.category.__name__}: {caught_one.message}"
            if line in self.logged_warnings or NO_VALIDATION in line:  # fedsim scores clients itself: meant
                continue
            self.logged_warnings.add(line)
            folder = Path(self.root or ".")
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / WARNINGS_LOG, "a") as log:
                log.write(f"{line} ({caught_one.filename}:{caught_one.lineno})\n")

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
