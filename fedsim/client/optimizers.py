"""The optimizers a local update steps, and how each update starts them afresh."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

GroupSettings = list[list[dict[str, Any]]]  # per optimizer, per param group: the values an update sets (lr, ...)


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

    def reset(self, settings: GroupSettings) -> None:
        """Optimizers and schedulers as configure_optimizers made them, with this update's settings: state cleared
        (momentum restarts with every local update, as in FedAvg's ClientUpdate), each group's values restored."""
        for opt, snapshots, overrides_ in zip(self.optimizers, self.snapshots, settings):
            opt.state.clear()
            for group, snapshot, override in zip(opt.param_groups, snapshots, overrides_):
                group.update(snapshot)
                group.update(override)
        for entry, state in zip(self.schedulers, self.scheduler_states):
            scheduler = entry["scheduler"]
            scheduler.load_state_dict(state)
            groups = scheduler.optimizer.param_groups
            scheduler.base_lrs = [g.get("initial_lr", g["lr"]) for g in groups]
            scheduler._last_lr = [g["lr"] for g in groups]

    def with_schedulers(self) -> list[dict]:
        """The optimizers in configure_optimizers' dict form, each with its scheduler (what a Trainer reads)."""
        scheduler_of = {id(s["scheduler"].optimizer): s for s in self.schedulers}
        return [{"optimizer": o, **({"lr_scheduler": scheduler_of[id(o)]} if id(o) in scheduler_of else {})}
                for o in self.optimizers]
