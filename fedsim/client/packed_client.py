"""A client of a pack (engine.pack): its algorithm's own client hook runs, unchanged, on a :class:`PackedClient`,
a :class:`~fedsim.algorithms.context.PackablePort` whose model is the client's own tensors. The hooks of a pack run
in lockstep (``fedsim.client.lockstep``): each runs until it asks for local training, and once every hook of the
pack has asked (or finished), the worker trains all the asking clients together (``fedsim.client.packed_trainer``).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from fedsim.algorithms.context import PackablePort, Penalty, RuntimePort, StepCallback
from fedsim.client.lockstep import LockstepThread
from fedsim.client.packed_trainer import TrainRequest
from fedsim.client.resident import BoundLayout
from fedsim.errors import UserCodeError

NOT_PACKABLE = "drop packable = True from the method, or set engine.pack: 1"


class PackedClient:
    """The packable port of one client of a pack: its own copy of the model's tensors, everything else the worker's.
    ``sgd`` parks the hook until the whole pack trains; a hook that asks for more than this port is refused."""

    def __init__(self, worker: PackablePort, layouts: Mapping[str, BoundLayout], parameter_keys: frozenset[str],
                 method: str, thread: LockstepThread):
        self._worker = worker
        self._thread = thread
        self._method = method
        self.device = worker.device
        self.local_epochs = worker.local_epochs
        full = layouts["full"]
        self.state = {key: t.detach().clone(memory_format=torch.contiguous_format) for key, t in zip(full.keys, full.targets)}
        self.layouts = {name: BoundLayout.over(layout, self.state, self.device) for name, layout in layouts.items()}
        self.layouts["full"].load(worker.initial("full"))
        self._parameters = {key: self.state[key] for key in parameter_keys}

    def whole_runtime(self, what: str) -> RuntimePort:
        raise UserCodeError(f"engine.pack: algorithm {self._method} {what}, which a packed client cannot; "
                            f"{NOT_PACKABLE}")

    def initial(self, layout: str) -> np.ndarray:
        return self._worker.initial(layout)

    def parameters(self) -> dict[str, torch.Tensor]:
        return self._parameters

    def stored(self, slot: str, client: int) -> np.ndarray | None:
        return self._worker.stored(slot, client)

    def load_global(self, weights: np.ndarray) -> None:
        self.layouts["shared"].load(weights)

    def learning_rates(self, layout: str, round_idx: int) -> np.ndarray:
        return self._worker.learning_rates(layout, round_idx)

    def client_tensors(self, client: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self._worker.client_tensors(client, split)

    def sgd(self, x: torch.Tensor, y: torch.Tensor, parts: frozenset[str], epochs: int, generator: torch.Generator,
            round_idx: int, penalty: Penalty | None = None, after_step: StepCallback | None = None,
            finetune: bool = False) -> list[torch.Tensor]:
        if after_step is not None or finetune:  # a per-step callback, or evaluation's fine-tuning (never packed)
            raise UserCodeError(f"engine.pack: algorithm {self._method} asks ctx.sgd for "
                                f"{'an after_step callback' if after_step else 'fine-tuning'}, which packed training "
                                f"does not run; {NOT_PACKABLE}")
        return self._thread.ask(TrainRequest(self.state, x, y, parts, epochs, generator, round_idx, penalty))
