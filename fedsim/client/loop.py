"""A local update as Lightning runs one, over fedsim's batches: the module's ``training_step`` with automatic or
manual optimization, its hooks and callbacks, ``self.log``, its lr schedulers, and what an algorithm freezes.

Each local update (a phase of an algorithm's client hook, or evaluation fine-tuning) is one Lightning *fit*:
``on_fit_start`` ... ``on_fit_end`` with one ``on_train_epoch_*`` per local epoch, optimizers and schedulers
fresh (their state cleared, their settings as ``configure_optimizers`` gave them), as a Flower client calling
``trainer.fit`` each round gets. A part the phase does not train is frozen (``requires_grad=False``, so no
optimizer can move it) and checked unchanged afterwards, whatever the module's code does. The fit itself runs in
``fedsim.client.fabric_loop`` or (model.client_loop: trainer) ``fedsim.client.trainer_loop``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import pytorch_lightning as pl
import torch
import torchmetrics
from torch.nn import functional as F

from fedsim.algorithms.context import Penalty, StepCallback
from fedsim.client.fabric import FedsimFabric
from fedsim.client.fabric_loop import Batch, FabricLoop
from fedsim.client.hooks import UserCode
from fedsim.client.logged import LoggedValues, install_logging
from fedsim.client.optimizers import GroupSettings, OptimizerSet
from fedsim.client.trainer_loop import TrainerLoop
from fedsim.config.learning import Precision
from fedsim.core.layout import KeyParts
from fedsim.errors import UserCodeError
from fedsim.models.lightning import network_of, overrides, part_parameters

SCORING_STEPS = ("validation_step", "test_step")
# Which of a module's steps a scoring pass runs, as Lightning runs them: "validation" (validation_step, on_validation_*
# hooks: the data.validation split), "test" (test_step, on_test_* hooks: the test split of a run with a validation
# split), or "evaluation": a run without a validation split scores its test data with both steps (on_validation_*).
ScoringStage = Literal["validation", "test", "evaluation"]
STAGE_STEPS: dict[str, tuple[str, ...]] = {"validation": ("validation_step",), "test": ("test_step",),
                                           "evaluation": SCORING_STEPS}


class LocalLoop:
    """One worker's module, driven as Lightning drives it, one local update at a time."""

    def __init__(self, module: pl.LightningModule, fabric: FedsimFabric, sets: dict[str, OptimizerSet],
                 keys: KeyParts, callbacks: list[pl.Callback], num_classes: int, listed: list[pl.Callback],
                 precision: Precision = "32", with_trainer: bool = False, trainer_root: str | None = None):
        # The plain module, under fabric.autocast(): on one device Fabric's wrapper hands out the module's own
        # methods (training_step included) without its precision context.
        self.module, self.fabric = module, fabric
        self.sets = sets  # "train", and "finetune" (evaluation fine-tuning: the same set, or fedsim's SGD)
        self.name = type(module).__name__
        self.part_params = part_parameters(module, keys)
        self.key_of = {id(p): k for k, p in network_of(module).named_parameters()}
        self.user = UserCode(module, callbacks)
        self.scoring_steps = [(name, getattr(module, name)) for name in SCORING_STEPS if overrides(module, name)]
        self.logged = LoggedValues(self.name)
        install_logging(module, self.logged)
        # self.current_epoch / self.global_step read a trainer only when one is attached: point them at the Fabric's
        # loop state, where Lightning already redirects a Fabric-driven module's self.trainer.
        module._trainer = module.trainer
        fabric.backward_hooks = (lambda loss: self.user.call("on_before_backward", loss),
                                 lambda: self.user.call("on_after_backward"))
        self.runner = (TrainerLoop(module, fabric, self.user, self.logged, listed, precision, trainer_root) if with_trainer
                       else FabricLoop(module, fabric, self.user, self.logged))
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro").to(fabric.device)

    def working_on(self, client: int, round_idx: int, what: str) -> None:
        """Who is at work: for error messages, and the module's ``self.trainer.fedsim``."""
        self.user.where = f" (client {client}, round {round_idx}, {what})"
        self.fabric.fedsim = {"client": client, "round": round_idx, "stage": what}

    # -- a local update -------------------------------------------------------------------------
    def fit(self, epoch_batches: Callable[[], Iterable[Batch]], epochs: int, parts: frozenset[str],
            settings: GroupSettings, penalty: Penalty | None = None, after_step: StepCallback | None = None,
            stage: str = "train") -> list[torch.Tensor]:
        """``epochs`` passes of ``training_step`` training ``parts`` with the ``stage``'s optimizers; ``settings``:
        per optimizer and group, the values (lr, ...) this update uses over what they were made with. Returns the
        per-step losses."""
        active = self.sets[stage]
        self.module._fabric_optimizers = active.wrapped  # what self.optimizers() returns under Fabric
        frozen = self._freeze(parts)
        active.reset(settings)
        f = self.fabric
        f.penalty, f.backwards, f.max_epochs, f.global_step = penalty, 0, epochs, 0
        f.fedsim = {**f.fedsim, "parts": sorted(parts)}
        self.module.train()
        try:
            losses, steps = self.runner.run(active, epoch_batches, epochs, after_step)
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
                                f"the {'+'.join(sorted(parts)) or 'nothing'}{self.user.where}; fedsim freezes the other "
                                "parts (requires_grad=False): change parameters only through the optimizers")

    # -- scoring ----------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, x: torch.Tensor, y: torch.Tensor, batch: int, suffix: str,
              stage: ScoringStage = "evaluation") -> tuple[float, float, dict[str, float]]:
        """(mean loss, accuracy) of the module's outputs on (x, y), and what the ``stage``'s steps log."""
        self.module.eval()
        self.accuracy.reset()
        steps = [(name, step) for name, step in self.scoring_steps if name in STAGE_STEPS[stage]]
        scoring = bool(steps)
        hook = "on_test" if stage == "test" else "on_validation"
        call = self.user.call
        if scoring:
            call(f"{hook}_start")
            call(f"{hook}_epoch_start")
        loss_sum = 0.0
        for batch_idx, start in enumerate(range(0, len(y), batch)):
            xb, yb = x[start:start + batch], y[start:start + batch]
            with self.fabric.autocast():
                logits = self.user.run("forward", self.module, xb)
                if scoring:
                    self._scoring_steps(steps, hook, (xb, yb), batch_idx)
            self.accuracy.update(logits, yb)
            loss_sum += float(F.cross_entropy(logits.float(), yb, reduction="sum"))
        if scoring:
            call(f"{hook}_epoch_end")
            call(f"{hook}_end")
        return loss_sum / len(y), float(self.accuracy.compute()), self.logged.collect(suffix)

    def _scoring_steps(self, steps: list[tuple[str, Callable]], hook: str, batch: Batch, batch_idx: int) -> None:
        self.logged.batch_size = len(batch[1])
        self.user.call(f"{hook}_batch_start", batch, batch_idx)
        for name, step in steps:
            out = self.user.run(name, step, batch, batch_idx)
            self.user.call(f"{hook}_batch_end", out, batch, batch_idx)
