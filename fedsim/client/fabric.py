"""The Fabric a worker's module runs under: what ``self.trainer`` shows the module, and the one place the
algorithm's penalty joins a loss."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning_fabric import Fabric

from fedsim.algorithms.context import Penalty


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

    def penalized(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` about to be backpropagated, with the penalty added: counted, and kept without the penalty as
        the step's loss. Every backward pass goes through here, Fabric's and a Trainer's alike."""
        self.step_loss = loss.detach() if self.step_loss is None else self.step_loss + loss.detach()
        self.backwards += 1
        return loss if self.penalty is None else loss + self.penalty()

    def backward(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        before, after = self.backward_hooks
        before(tensor)
        super().backward(self.penalized(tensor), *args, **kwargs)
        after()
