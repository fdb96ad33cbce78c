"""How the run's config sets a local update's optimizers: each param group's lr, momentum and weight decay in a
round, for training and for evaluation's fine-tuning.

The one statement of the rule (docs/lightning.md). fedsim's own optimizers (a module without configure_optimizers)
are made with train.body / train.head, or for fine-tuning with FedBABU's protocol (SGD per part with
eval.finetune_momentum / finetune_weight_decay), and take the part's scheduled lr each round. A module's own
optimizers keep their settings, their learning rates scaled by the part's round schedule (train.<part>.schedule).
When fine-tuning, eval.finetune_lr (if set) replaces every group's lr. Sequential training, packed training and a
method's own optimizer (``ctx.param_groups``) all read it here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fedsim.client.optimizers import GroupSettings, OptimizerSet
from fedsim.config import OptimConfig, RunConfig


@dataclass(frozen=True)
class Hyper:
    """One tensor's SGD settings in a local update (torch.optim.SGD's, without dampening or Nesterov)."""
    lr: float
    momentum: float
    weight_decay: float


class OptimizerSettings:
    """The run's optimizer settings, per part (body, head), round and stage (training or fine-tuning)."""

    def __init__(self, cfg: RunConfig, own_optimizers: bool):
        self.cfg = cfg
        self.own_optimizers = own_optimizers  # the module's configure_optimizers (else fedsim's, per part)

    def made_with(self, finetune: bool) -> dict[str, OptimConfig]:
        """What fedsim's own optimizers of each part are made with."""
        if not finetune:
            return {"body": self.cfg.train.body, "head": self.cfg.train.head}
        e = self.cfg.eval
        sgd = OptimConfig(optimizer="sgd", momentum=e.finetune_momentum, weight_decay=e.finetune_weight_decay)
        return {"body": sgd, "head": sgd}

    def _finetune_lr(self, finetune: bool) -> float | None:
        """eval.finetune_lr when fine-tuning sets one: it replaces every group's lr, fedsim's optimizers' or a
        module's own."""
        return self.cfg.eval.finetune_lr if finetune else None

    def lr(self, part: str, round_idx: int, finetune: bool = False) -> float:
        """fedsim's own lr of ``part`` in a local update of ``round_idx``."""
        fixed = self._finetune_lr(finetune)
        return fixed if fixed is not None else getattr(self.cfg.train, part).lr_at(round_idx, self.cfg.train.rounds)

    def sgd(self, part: str, round_idx: int, finetune: bool = False) -> Hyper:
        """fedsim's own SGD settings of ``part`` in a local update of ``round_idx`` (what its optimizers use)."""
        made = self.made_with(finetune)[part]
        return Hyper(self.lr(part, round_idx, finetune), made.momentum, made.weight_decay)

    def param_groups(self, tensors: Mapping[str, list[torch.Tensor]], parts: frozenset[str],
                     round_idx: int) -> list[dict]:
        """torch optimizer param groups of ``tensors`` (by part) of ``parts``, one per part, each with fedsim's own
        SGD settings of that part in ``round_idx``."""
        groups = []
        for part in ("body", "head"):
            if part in parts and tensors[part]:
                h = self.sgd(part, round_idx)
                groups.append({"params": tensors[part], "lr": h.lr, "momentum": h.momentum,
                               "weight_decay": h.weight_decay})
        return groups

    def overrides(self, chosen: OptimizerSet, round_idx: int, finetune: bool) -> GroupSettings:
        """Per optimizer and param group of ``chosen``, what a local update of ``round_idx`` sets over the values
        it was made with."""
        fixed = self._finetune_lr(finetune)
        out = []
        for parts_of_groups, snapshots in zip(chosen.group_parts, chosen.snapshots):
            row = []
            for parts, snapshot in zip(parts_of_groups, snapshots):
                part = "body" if "body" in parts else "head"  # a group of both follows the body's schedule
                if not self.own_optimizers:
                    override = {"lr": self.lr(part, round_idx, finetune)}
                elif fixed is not None:
                    override = {"lr": fixed, "initial_lr": fixed}
                else:
                    scale = getattr(self.cfg.train, part).scale_at(round_idx, self.cfg.train.rounds)
                    override = {"lr": snapshot["lr"] * scale}
                    override |= {"initial_lr": snapshot["initial_lr"] * scale} if "initial_lr" in snapshot else {}
                row.append(override)
            out.append(row)
        return out

    def learning_rates(self, train: OptimizerSet, round_idx: int) -> dict[int, float]:
        """The training lr of every tensor ``train`` steps in ``round_idx``, by the tensor's id."""
        return {id(p): override["lr"] for opt, row in zip(train.optimizers, self.overrides(train, round_idx, False))
                for group, override in zip(opt.param_groups, row) for p in group["params"]}
