"""A local update as Lightning runs one, over fedsim's batches: the module's ``training_step`` with automatic or
manual optimization, its hooks and callbacks, ``self.log``, its lr schedulers, and what an algorithm freezes.

Each local update (a phase of an algorithm's client hook, or evaluation fine-tuning) is one Lightning *fit*:
``on_fit_start`` ... ``on_fit_end`` with one ``on_train_epoch_*`` per local epoch, optimizers and schedulers
fresh (their state cleared, their settings as ``configure_optimizers`` gave them), as a Flower client calling
``trainer.fit`` each round gets. A part the phase does not train is frozen (``requires_grad=False``, so no
optimizer can move it) and checked unchanged afterwards, whatever the module's code does.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
import torchmetrics
from lightning_fabric import Fabric
from torch.nn import functional as F

from fedsim.algorithms.context import Penalty, StepCallback
from fedsim.core.layout import KeyParts
from fedsim.core.protocol import RECORD_KEYS
from fedsim.errors import UserCodeError
from fedsim.models.lightning import network_of, overrides, part_parameters

Batch = tuple[torch.Tensor, torch.Tensor]
HOOKS = ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_before_backward",
         "on_after_backward", "on_before_optimizer_step", "on_train_batch_end", "on_train_epoch_end", "on_train_end",
         "on_fit_end", "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
         "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end")
SCORING_STEPS = ("validation_step", "test_step")


class FedsimFabric(Fabric):
    """Fabric that adds the algorithm's penalty (FedProx's pull, Ditto's anchor, SCAFFOLD's correction) to every
    backward pass, a module's own ``manual_backward`` included, and keeps the loss it was given. The attributes set
    here are what ``self.trainer`` shows a module: Lightning redirects a Fabric-driven module's trainer to its Fabric."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.penalty: Penalty | None = None
        self.step_loss: torch.Tensor | None = None  # the losses backpropagated in the current step, without penalty
        self.backwards = 0
        self.backward_hooks: tuple[Callable, Callable] = (lambda loss: None, lambda: None)
        self.current_epoch = 0
        self.global_step = 0
        self.max_epochs = 0
        self.callback_metrics: dict[str, Any] = {}
        self.fedsim: dict[str, Any] = {}  # the client, round and trained parts of the current local update

    def backward(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        before, after = self.backward_hooks
        before(tensor)
        loss = tensor.detach()
        self.step_loss = loss if self.step_loss is None else self.step_loss + loss
        if self.penalty is not None:
            tensor = tensor + self.penalty()
        self.backwards += 1
        super().backward(tensor, *args, **kwargs)
        after()


class LoggedValues:
    """What a module logs with ``self.log`` / ``self.log_dict`` in one client's work, reduced as Lightning reduces
    an epoch's values: the mean weighted by batch size (or ``reduce_fx`` sum, max, min); a torchmetrics object is
    computed once at the end and reset."""

    def __init__(self, module_name: str):
        self.module_name = module_name
        self.batch_size = 1
        self.values: dict[str, tuple[str, torch.Tensor, float]] = {}
        self.metrics: dict[str, torchmetrics.Metric] = {}

    def add(self, name: str, value: Any, reduce_fx: Any = "mean", batch_size: int | None = None) -> None:
        if isinstance(value, torchmetrics.Metric):
            self.metrics[name] = value
            return
        v = value.detach().float() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        if v.numel() != 1:
            raise UserCodeError(f"model.client: {self.module_name} logged {name!r} with {v.numel()} values; "
                                "self.log takes one number (or a torchmetrics object)")
        fx = reduce_fx if isinstance(reduce_fx, str) else getattr(reduce_fx, "__name__", "mean")
        fx = {"amax": "max", "amin": "min"}.get(fx, fx)
        weight = float(batch_size or self.batch_size) if fx == "mean" else 1.0
        v = v.reshape(())
        if name not in self.values:
            self.values[name] = (fx, v * weight, weight)
            return
        _, acc, total = self.values[name]
        combined = {"mean": lambda: acc + v * weight, "sum": lambda: acc + v,
                    "max": lambda: torch.maximum(acc, v), "min": lambda: torch.minimum(acc, v)}
        if fx not in combined:
            raise UserCodeError(f"model.client: {self.module_name} logged {name!r} with reduce_fx={reduce_fx!r}; "
                                "use mean, sum, max or min")
        self.values[name] = (fx, combined[fx](), total + weight)

    def collect(self, suffix: str = "") -> dict[str, float]:
        """The reduced values (names + ``suffix``), then a clean slate."""
        out = {name + suffix: float(acc / total if fx == "mean" else acc) for name, (fx, acc, total) in self.values.items()}
        for name, metric in self.metrics.items():
            out[name + suffix] = float(metric.compute())
            metric.reset()
        self.values, self.metrics = {}, {}
        clash = sorted(set(out) & RECORD_KEYS)
        if clash:
            raise UserCodeError(f"model.client: {self.module_name} logged {clash[0]!r}, a name fedsim's own records use; "
                                "log it under another name")
        return out


def install_logging(module: pl.LightningModule, sink: LoggedValues) -> None:
    """``self.log`` / ``self.log_dict`` with Lightning's signatures, into ``sink`` (numbers, tensors and
    torchmetrics objects; Fabric's own path refuses the last)."""

    def log(name: str, value: Any, *args: Any, reduce_fx: Any = "mean", batch_size: int | None = None,
            **kwargs: Any) -> None:
        sink.add(name, value, reduce_fx, batch_size)

    def log_dict(dictionary: Mapping[str, Any], *args: Any, reduce_fx: Any = "mean", batch_size: int | None = None,
                 **kwargs: Any) -> None:
        for name, value in dict(dictionary).items():
            sink.add(name, value, reduce_fx, batch_size)

    module.log, module.log_dict = log, log_dict


@dataclass
class OptimizerSet:
    """Optimizers a local update steps: the torch optimizers and schedulers, Fabric's wrappers of them (what the
    module's ``self.optimizers()`` returns), the parts each param group trains, and what each group and scheduler
    held when made (restored before every update)."""
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[dict[str, Any]]
    wrapped: list
    group_parts: list[list[frozenset[str]]]
    snapshots: list[list[dict]] = field(init=False)
    scheduler_states: list[dict] = field(init=False)

    def __post_init__(self) -> None:
        self.snapshots = [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups] for o in self.optimizers]
        self.scheduler_states = [s["scheduler"].state_dict() for s in self.schedulers]


class LocalLoop:
    """One worker's module, driven as Lightning drives it, one local update at a time."""

    def __init__(self, module: pl.LightningModule, fabric: FedsimFabric, sets: dict[str, OptimizerSet],
                 keys: KeyParts, callbacks: list[pl.Callback], num_classes: int, listed: list[pl.Callback],
                 precision: str = "32", with_trainer: bool = False):
        # The plain module, under fabric.autocast(): on one device Fabric's wrapper hands out the module's own
        # methods (training_step included) without its precision context.
        self.module, self.fabric = module, fabric
        self.sets = sets  # "train", and "finetune" (evaluation fine-tuning: the same set, or fedsim's SGD)
        self.active = sets["train"]
        self.automatic = module.automatic_optimization
        self.name = type(module).__name__
        self.part_params = part_parameters(module, keys)
        self.key_of = {id(p): k for k, p in network_of(module).named_parameters()}
        self.hooks = {name: self._bound(name, callbacks) for name in HOOKS}
        self.listed = listed  # model.callbacks: a Trainer gets these (it asks the module for its own itself)
        self.with_trainer, self.precision = with_trainer, precision  # model.client_loop: trainer; model.precision
        self.scoring_steps = [(name, getattr(module, name)) for name in SCORING_STEPS if overrides(module, name)]
        self.logged = LoggedValues(self.name)
        install_logging(module, self.logged)
        # self.current_epoch / self.global_step read a trainer only when one is attached: point them at the Fabric's
        # loop state, where Lightning already redirects a Fabric-driven module's self.trainer.
        module._trainer = module.trainer
        fabric.backward_hooks = (lambda loss: self._call("on_before_backward", loss), lambda: self._call("on_after_backward"))
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro").to(fabric.device)
        self.where = ""  # the client and round at work, for error messages

    def _bound(self, hook: str, callbacks: list[pl.Callback]) -> list[Callable]:
        """The module's own override of ``hook`` and each callback's, as Lightning calls them (a callback gets the
        trainer, which for a Fabric-driven module is its Fabric, and the module first)."""
        own = [getattr(self.module, hook)] if overrides(self.module, hook) else []
        trainer = self.module.trainer
        return own + [(lambda *a, cb=cb: getattr(cb, hook)(trainer, self.module, *a)) for cb in callbacks
                      if getattr(type(cb), hook, None) is not getattr(pl.Callback, hook, None)]

    # -- user code, reported as the user's ------------------------------------------------------
    def _user(self, what: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except (UserCodeError, torch.OutOfMemoryError):
            raise
        except Exception as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
            raise UserCodeError(f"model.client: {self.name}.{what} raised {type(err).__name__}: {message}"
                                f"{self.where}; fix the module") from None

    def _call(self, hook: str, *args: Any) -> None:
        for fn in self.hooks[hook]:
            self._user(hook, fn, *args)

    # -- a local update -------------------------------------------------------------------------
    def fit(self, epoch_batches: Callable[[], Iterable[Batch]], epochs: int, parts: frozenset[str],
            settings: list[list[dict]], penalty: Penalty | None = None, after_step: StepCallback | None = None,
            stage: str = "train") -> list[torch.Tensor]:
        """``epochs`` passes of ``training_step`` training ``parts`` with the ``stage``'s optimizers; ``settings``:
        per optimizer and group, the values (lr, ...) this update uses over what they were made with. Returns the
        per-step losses."""
        self.active = self.sets[stage]
        self.module._fabric_optimizers = self.active.wrapped  # what self.optimizers() returns under Fabric
        frozen = self._freeze(parts)
        self._reset(settings)
        f = self.fabric
        f.penalty, f.backwards, f.max_epochs, f.global_step = penalty, 0, epochs, 0
        f.fedsim = {**f.fedsim, "parts": sorted(parts)}
        self.module.train()
        run = self._fit_with_trainer if self.with_trainer else self._fit_with_fabric
        try:
            losses, steps = run(epoch_batches, epochs, after_step)
        finally:
            f.penalty = None
            for p, _ in frozen:
                p.requires_grad_(True)
        self._check_frozen(frozen, parts)
        if steps and not f.backwards:
            raise UserCodeError(f"model.client: {self.name}.training_step ran {steps} steps without a backward pass, "
                                "so nothing trained; return the loss (automatic optimization) or call "
                                "self.manual_backward(loss) and step self.optimizers() (manual)")
        return losses

    def _fit_with_fabric(self, epoch_batches: Callable[[], Iterable[Batch]], epochs: int,
                         after_step: StepCallback | None) -> tuple[list[torch.Tensor], int]:
        """Lightning's fit loop over the module, its hooks and callbacks: (per-step losses, steps)."""
        losses: list[torch.Tensor] = []
        steps = 0
        self._call("on_fit_start")
        self._call("on_train_start")
        for epoch in range(epochs):
            self.fabric.current_epoch = epoch
            self._call("on_train_epoch_start")
            for batch_idx, batch in enumerate(epoch_batches()):
                loss = self._step(batch, batch_idx)
                steps += 1
                if loss is not None:
                    losses.append(loss)
                if after_step is not None:
                    after_step(*batch)
            self._call("on_train_epoch_end")
            self._step_schedulers("epoch", epoch + 1)
        self._call("on_train_end")
        self._call("on_fit_end")
        return losses, steps

    def _fit_with_trainer(self, epoch_batches: Callable[[], Iterable[Batch]], epochs: int,
                          after_step: StepCallback | None) -> tuple[list[torch.Tensor], int]:
        """The same local update as one ``pl.Trainer.fit`` (model.client_loop: trainer): the Trainer runs the loop,
        hooks and callbacks; fedsim hands it the update's optimizers and adds the penalty to the module's loss."""
        module, f = self.module, self.fabric
        losses: list[torch.Tensor] = []
        steps = 0

        def with_penalty(loss: torch.Tensor) -> torch.Tensor:
            f.backwards += 1
            f.step_loss = loss.detach() if f.step_loss is None else f.step_loss + loss.detach()
            return loss if f.penalty is None else loss + f.penalty()

        step, backward = module.training_step, module.manual_backward

        def training_step(batch: Batch, batch_idx: int) -> Any:
            nonlocal steps
            f.step_loss, steps = None, steps + 1
            self.logged.batch_size = len(batch[1])
            out = step(batch, batch_idx)
            if not module.automatic_optimization:
                loss = f.step_loss
            elif isinstance(out, Mapping) and out.get("loss") is not None:
                out, loss = {**out, "loss": with_penalty(out["loss"])}, f.step_loss
            else:
                out, loss = (None, None) if out is None else (with_penalty(out), f.step_loss)
            if loss is not None:
                losses.append(loss)
            if after_step is not None:
                after_step(*batch)
            return out

        class Batches:  # iterated once per epoch, as a DataLoader would be
            def __iter__(self):
                return iter(epoch_batches())

        trainer = pl.Trainer(max_epochs=epochs, accelerator=f.device.type, devices=1, precision=self.precision,
                             logger=False, callbacks=list(self.listed), enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             limit_val_batches=0)
        saved = module._fabric, module._trainer
        module.training_step = training_step
        module.manual_backward = lambda loss, *a, **k: backward(with_penalty(loss), *a, **k)
        module.configure_optimizers = self._with_schedulers
        module._fabric = None  # the Trainer's strategy, not Fabric's, steps and backpropagates in this fit
        try:
            with warnings.catch_warnings():  # fedsim scores clients itself: a Trainer without validation data is meant
                warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
                self._user("Trainer.fit", trainer.fit, module, Batches())
        finally:
            module._fabric, module._trainer = saved
            for name in ("training_step", "manual_backward", "configure_optimizers"):
                del module.__dict__[name]
        return losses, steps

    def _with_schedulers(self) -> list[dict]:
        """The update's optimizers in configure_optimizers' dict form, each with its scheduler, for the Trainer."""
        scheduler_of = {id(s["scheduler"].optimizer): s for s in self.active.schedulers}
        return [{"optimizer": o, **({"lr_scheduler": scheduler_of[id(o)]} if id(o) in scheduler_of else {})}
                for o in self.active.optimizers]

    def _step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        f = self.fabric
        f.step_loss = None
        self.logged.batch_size = len(batch[1])
        self._call("on_train_batch_start", batch, batch_idx)
        with f.autocast():
            out = self._user("training_step", self.module.training_step, batch, batch_idx)
        if self.automatic:
            loss = out.get("loss") if isinstance(out, Mapping) else out
            if loss is not None:  # Lightning skips the optimizer step of a training_step that returns None
                self._optimize(loss)
        self._call("on_train_batch_end", out, batch, batch_idx)
        f.global_step += 1
        self._step_schedulers("step", f.global_step)
        return f.step_loss

    def _optimize(self, loss: torch.Tensor) -> None:
        """Lightning's automatic optimization: zero_grad, backward, step; of the module's one optimizer, or of
        fedsim's one per part for a module without configure_optimizers."""
        for opt in self.active.wrapped:
            opt.zero_grad(set_to_none=True)
        self.fabric.backward(loss)
        for opt in self.active.wrapped:
            self._call("on_before_optimizer_step", opt)
            opt.step()

    def _step_schedulers(self, interval: str, count: int) -> None:
        for entry in self.active.schedulers:
            if entry["interval"] == interval and count % entry["frequency"] == 0:
                self._user("lr_scheduler.step", entry["scheduler"].step)

    def _reset(self, settings: list[list[dict]]) -> None:
        """Optimizers and schedulers as configure_optimizers made them, with this update's settings: state cleared
        (momentum restarts with every local update, as in FedAvg's ClientUpdate), each group's values restored."""
        for opt, snapshots, overrides_ in zip(self.active.optimizers, self.active.snapshots, settings):
            opt.state.clear()
            for group, snapshot, override in zip(opt.param_groups, snapshots, overrides_):
                group.update(snapshot)
                group.update(override)
        for entry, state in zip(self.active.schedulers, self.active.scheduler_states):
            scheduler = entry["scheduler"]
            scheduler.load_state_dict(state)
            groups = scheduler.optimizer.param_groups
            scheduler.base_lrs = [g.get("initial_lr", g["lr"]) for g in groups]
            scheduler._last_lr = [g["lr"] for g in groups]

    # -- what a phase freezes ---------------------------------------------------------------------
    def _freeze(self, parts: frozenset[str]) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        frozen = [p for part, ps in self.part_params.items() if part not in parts for p in ps if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        return [(p, p.detach().clone()) for p in frozen]

    def _check_frozen(self, frozen: list[tuple[torch.nn.Parameter, torch.Tensor]], parts: frozenset[str]) -> None:
        moved = [self.key_of.get(id(p), "?") for p, before in frozen if not torch.equal(p.detach(), before)]
        if moved:
            raise UserCodeError(f"model.client: {self.name} changed {moved[0]} during a local update that trains only "
                                f"the {'+'.join(sorted(parts)) or 'nothing'}{self.where}; fedsim freezes the other "
                                "parts (requires_grad=False): change parameters only through the optimizers")

    # -- scoring ----------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, x: torch.Tensor, y: torch.Tensor, batch: int, suffix: str) -> tuple[float, float, dict[str, float]]:
        """(mean loss, accuracy) of the module's outputs on (x, y), and what its validation_step / test_step log."""
        self.module.eval()
        self.accuracy.reset()
        scoring = bool(self.scoring_steps)
        if scoring:
            self._call("on_validation_start")
            self._call("on_validation_epoch_start")
        loss_sum = 0.0
        for batch_idx, start in enumerate(range(0, len(y), batch)):
            xb, yb = x[start:start + batch], y[start:start + batch]
            with self.fabric.autocast():
                logits = self._user("forward", self.module, xb)
                if scoring:
                    self._validate((xb, yb), batch_idx)
            self.accuracy.update(logits, yb)
            loss_sum += float(F.cross_entropy(logits.float(), yb, reduction="sum"))
        if scoring:
            self._call("on_validation_epoch_end")
            self._call("on_validation_end")
        return loss_sum / len(y), float(self.accuracy.compute()), self.logged.collect(suffix)

    def _validate(self, batch: Batch, batch_idx: int) -> None:
        self.logged.batch_size = len(batch[1])
        self._call("on_validation_batch_start", batch, batch_idx)
        for name, step in self.scoring_steps:
            out = self._user(name, step, batch, batch_idx)
            self._call("on_validation_batch_end", out, batch, batch_idx)

