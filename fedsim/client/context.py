"""The runtime primitives an algorithm's client hook works with, for one client in one round.

A hook loads state into the one shared network (``load``, ``unpack``), trains it (``sgd``), reads
what it needs (``pack``, ``slot``) and leaves its results through ``commit_model``, ``upload`` and
``set_slot``. Results are staged here and kept by the runtime only if the client's loss stayed
finite, so a diverged client leaves nothing behind.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsim.algorithms import WEIGHTS

if TYPE_CHECKING:
    from fedsim.client.runtime import ClientRuntime

Penalty = Callable[[], torch.Tensor]
StepCallback = Callable[[torch.Tensor, torch.Tensor], None]


class ClientContext:
    def __init__(self, runtime: ClientRuntime, client: int, round_idx: int, broadcast: dict[str, np.ndarray],
                 generator: torch.Generator):
        self._rt = runtime
        self.client = client
        self.round = round_idx
        self.broadcast = broadcast
        self.generator = generator  # all of this client's randomness in this round
        self.net = runtime.net
        self.local_epochs = runtime.cfg.train.local_epochs
        self.uploads: dict[str, torch.Tensor] = {}  # on the worker's device
        self.slots: dict[str, np.ndarray] = {}  # staged per-client state, kept if the round succeeds
        self._data: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- the model -------------------------------------------------------------------------------
    @property
    def full_keys(self) -> tuple[str, ...]:
        return self._rt.layouts["full"].keys

    def load(self) -> None:
        """The received global weights and this client's personal part. The global part is copied in only
        if the model does not hold it already: scoring many clients swaps only their personal parts."""
        weights = self.broadcast[WEIGHTS]
        if not self._rt.holds(weights):
            self.unpack("shared", self._rt.resident(weights))
            self._rt.mark_held(weights)
        self.unpack("personal", self.slot("personal", default=self._rt.initial["personal"]))

    def unpack(self, layout: str, vector: np.ndarray | torch.Tensor) -> None:
        self._rt.layouts[layout].unpack_into(self.net, vector)

    def pack(self, layout: str) -> np.ndarray:
        return self._rt.layouts[layout].pack(self.net)

    def initial(self, layout: str) -> np.ndarray:
        """The round-0 value of a layout (every client starts from the same model)."""
        return self._rt.initial[layout]

    def tensors(self, layout: str, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """A vector of ``layout`` as named tensors on the model's device (copies)."""
        return self._rt.layouts[layout].tensors(vector, self._rt.device)

    def vector(self, layout: str, tensors: dict[str, torch.Tensor]) -> np.ndarray:
        return self._rt.layouts[layout].vector(tensors)

    def commit_model(self, keep_personal: bool = True) -> None:
        """The trained model is this round's result: its shared part is uploaded, its personal part kept
        (unless ``keep_personal`` is false: the client then starts every round from the initial one)."""
        self.upload(WEIGHTS, self._rt.layouts["shared"].pack_tensor())  # stays on the device: summed there
        if keep_personal and self._rt.layouts["personal"].size:  # FedAvg-like: nothing personal to keep
            self.set_slot("personal", self.pack("personal"))

    # -- state and uploads -----------------------------------------------------------------------
    def slot(self, name: str, default: np.ndarray | Iterable[float]) -> np.ndarray:
        """This client's value of a per-client state slot (``default`` before its first write)."""
        if name in self.slots:
            return self.slots[name]
        store = self._rt.slots[name]
        return store[self.client] if self.client in store else np.asarray(default, np.float32)

    def set_slot(self, name: str, vector: np.ndarray | Iterable[float]) -> None:
        self.slots[name] = np.asarray(vector, np.float32)

    def upload(self, name: str, vector: np.ndarray | torch.Tensor) -> None:
        self.uploads[name] = torch.as_tensor(vector, device=self._rt.device)

    # -- training --------------------------------------------------------------------------------
    def learning_rates(self, layout: str) -> np.ndarray:
        """This round's training learning rate of every value of ``layout`` (0 for buffers)."""
        return self._rt.learning_rates(layout, self.round)

    def proximal(self, coef: float, keys: Iterable[str] | None = None) -> Penalty | None:
        """coef/2 ||w - w_now||^2 over the parameters among ``keys`` (default: the shared ones), anchored at
        their current values. None when it would be zero, so coef = 0 is plain SGD bit for bit."""
        params = dict(self.net.named_parameters())
        wanted = self._rt.layouts["shared"].keys if keys is None else keys
        pairs = [(params[k], params[k].detach().clone()) for k in wanted if k in params]
        if coef <= 0 or not pairs:
            return None
        return lambda: coef / 2 * sum(((p - a) ** 2).sum() for p, a in pairs)

    def linear(self, coefs: np.ndarray) -> Penalty:
        """<coefs, w> over the shared parameters: adds ``coefs`` to every gradient (SCAFFOLD's correction)."""
        params = dict(self.net.named_parameters())
        named = self.tensors("shared", coefs)
        pairs = [(params[k], named[k]) for k in named if k in params]
        return lambda: sum((p * c).sum() for p, c in pairs)

    def sgd(self, parts: frozenset[str], epochs: int, penalty: Penalty | None = None,
            after_step: StepCallback | None = None) -> list[torch.Tensor]:
        """``epochs`` of local training of ``parts`` on this client's data; returns the per-step losses."""
        x, y = self.data()
        return self._rt.sgd(x, y, parts, epochs, self.generator, self.round, penalty=penalty, after_step=after_step)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This client's training images and labels on the model's device."""
        if self._data is None:
            self._data = self._rt.tensors(self.client, "train")
        return self._data
