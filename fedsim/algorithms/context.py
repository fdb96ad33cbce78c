"""The runtime primitives an algorithm's client hook works with, for one client in one round.

A hook loads state into the one shared network (``load``, ``unpack``), trains it (``sgd``), reads what it
needs (``pack``, ``slot``) and leaves its results through ``commit_model``, ``upload`` and ``set_slot``.
Results are staged here and kept by the runtime only if the client's loss stayed finite, so a diverged
client leaves nothing behind.

The context reaches the worker's runtime only through two small typed interfaces: :class:`PackablePort`, what every
client has, a packed client's (``fedsim.client.packed_client.PackedClient``, engine.pack) included, and
:class:`RuntimePort`, which extends it with the one network for a method that works on it itself (the worker's
``fedsim.client.runtime.ClientRuntime``). A hook that uses only what the packable port offers can be packed;
algorithms never see the runtime itself.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal, Protocol, overload

import numpy as np
import torch
from torch import nn

from fedsim.core.protocol import WEIGHTS

# A term added to the loss before every backward pass; a plain 0 where it covers no parameters (sum of nothing).
Penalty = Callable[[], torch.Tensor | float]
StepCallback = Callable[[torch.Tensor, torch.Tensor], None]
# (input of the output layer, its logits) -> the logits a client is scored with (ctx.score_with); with
# on="network": (the network's input, its logits)
LogitAdjustment = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
AdjustedModule = Literal["output_layer", "network"]


class Proximal:
    """coef/2 ||w - anchor||^2 over some parameters: called, it is a penalty on the live parameters it was made
    with; packed training (engine.pack) reads ``coef`` and ``anchors`` and applies it to every client of a pack."""

    def __init__(self, coef: float, live: dict[str, torch.Tensor]):
        self.coef = coef
        self.live = live
        self.anchors = {k: p.detach().clone() for k, p in live.items()}

    def __call__(self) -> torch.Tensor | float:
        return self.coef / 2 * sum(((self.live[k] - a) ** 2).sum() for k, a in self.anchors.items())


class LinearTerm:
    """<coefs, w> over some parameters: adds ``coefs`` to their gradients (SCAFFOLD's correction); called, a penalty
    on the live parameters; packed training reads ``coefs``."""

    def __init__(self, coefs: dict[str, torch.Tensor], live: dict[str, torch.Tensor]):
        self.coefs = coefs
        self.live = live

    def __call__(self) -> torch.Tensor | float:
        return sum((self.live[k] * c).sum() for k, c in self.coefs.items())


class DeviceLayout(Protocol):
    """A layout (``shared``, ``personal``, ``full``) bound to the worker's model on its device."""

    @property
    def keys(self) -> tuple[str, ...]: ...

    @property
    def size(self) -> int: ...

    def load(self, vector: np.ndarray | torch.Tensor) -> None:
        """Copy a flat vector into the model."""

    def pack(self) -> np.ndarray:
        """The model's values as a new flat float32 vector on the host."""

    def pack_tensor(self) -> torch.Tensor:
        """The model's values as a new flat float32 vector on the device."""

    def tensors(self, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """Each key's values of ``vector`` as its own tensor on the device (copies)."""

    def vector(self, tensors: dict[str, torch.Tensor]) -> np.ndarray:
        """The inverse of ``tensors``."""


class PackablePort(Protocol):
    """What every runtime offers a client hook, a packed client's (engine.pack) included: a method whose client hook
    needs nothing more may declare ``packable = True``."""

    @property
    def device(self) -> torch.device:
        """Where the client trains; uploads stay there and are summed there."""

    @property
    def local_epochs(self) -> int: ...

    @property
    def layouts(self) -> Mapping[str, DeviceLayout]: ...

    def initial(self, layout: str) -> np.ndarray:
        """The round-0 value of a layout (every client starts from the same model)."""

    def parameters(self) -> dict[str, torch.Tensor]:
        """The client's trainable tensors by state-dict key, as the loss sees them (penalties are built on them)."""

    def stored(self, slot: str, client: int) -> np.ndarray | None:
        """A client's value of a per-client state slot as kept after its last successful round, or None."""

    def load_global(self, weights: np.ndarray) -> None:
        """Put received global weights into the model's shared part (a no-op when it holds them untouched)."""

    def learning_rates(self, layout: str, round_idx: int) -> np.ndarray:
        """Per value of ``layout``: its part's training lr in that round, 0 for buffers (never trained)."""

    def sgd(self, x: torch.Tensor, y: torch.Tensor, parts: frozenset[str], epochs: int, generator: torch.Generator,
            round_idx: int, penalty: Penalty | None = None, after_step: StepCallback | None = None,
            finetune: bool = False) -> list[torch.Tensor]:
        """Local training of ``parts`` on (x, y); returns the per-step losses."""

    def client_tensors(self, client: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's ``train``, ``val`` (data.validation's held-out part of its training data) or ``test`` images and
        labels on the model's device."""

    def whole_runtime(self, what: str) -> RuntimePort:
        """The worker's whole runtime, for a hook that ``what`` (e.g. "reads ctx.net"): the runtime itself, or, on
        a packed client, which has no more than this port, a one-line error naming the method."""


class RuntimePort(PackablePort, Protocol):
    """A worker's whole runtime: the packable port, and the one network for a method that works on it itself."""

    @property
    def net(self) -> nn.Module:
        """The one network every client of the worker trains in turn."""

    @property
    def output_layer(self) -> nn.Linear:
        """Its head's last linear layer."""

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(mean loss, accuracy) of the model as it is on (x, y), in evaluation mode."""

    def batches(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of training batches, drawn as ``sgd`` draws them."""

    def param_groups(self, parts: frozenset[str], round_idx: int) -> list[dict[str, Any]]:
        """torch optimizer param groups of the trainable tensors of ``parts``, one per part, each with fedsim's own
        SGD settings of that part in ``round_idx`` (lr on its schedule, momentum, weight_decay)."""


class ClientContext:
    def __init__(self, runtime: PackablePort, client: int, round_idx: int, broadcast: dict[str, np.ndarray],
                 generator: torch.Generator):
        self._rt = runtime
        self.client = client  # this client's index (0 .. data.num_clients - 1)
        self.round = round_idx  # the round this client trains or is scored in
        self.broadcast = broadcast  # what the server sent this round: WEIGHTS and the method's server state, read-only
        self.generator = generator  # all of this client's randomness in this round
        self.local_epochs = runtime.local_epochs  # train.local_epochs: a round's epochs of local training
        self.uploads: dict[str, torch.Tensor] = {}  # staged uploads by name, on the worker's device (see ``upload``)
        self.slots: dict[str, np.ndarray] = {}  # staged per-client state, kept if the round succeeds
        self._data: tuple[torch.Tensor, torch.Tensor] | None = None
        self.logit_adjustment: LogitAdjustment | None = None  # what score_with set, applied while this client is scored
        self.logit_adjustment_on: AdjustedModule = "output_layer"  # the module whose (input, output) it sees
        self.recorded: dict[str, float] = {}  # what ``record`` noted of this client's round: its mechanism, by name

    # -- the model -------------------------------------------------------------------------------
    @property
    def net(self) -> nn.Module:
        """The network the client trains in, for a hook that needs the module itself (APFL's mixed forward). A
        packed client has none of its own, so such a method does not declare ``packable = True``."""
        return self._rt.whole_runtime("reads ctx.net").net

    @property
    def full_keys(self) -> tuple[str, ...]:
        """The state-dict keys of the whole model, in the order of its flat vectors (the ``full`` layout)."""
        return self._rt.layouts["full"].keys

    def load(self, weights: np.ndarray | None = None) -> None:
        """The received global weights (or ``weights``: one of several models a method received, IFCA's cluster
        model) and this client's personal part. The global part is copied in only if the model does not hold it
        already: scoring many clients swaps only their personal parts."""
        self._rt.load_global(self.broadcast[WEIGHTS] if weights is None else weights)
        self.unpack("personal", self.slot("personal", default=self._rt.initial("personal")))

    def unpack(self, layout: str, vector: np.ndarray | torch.Tensor) -> None:
        """Copy a flat vector of ``layout`` (``shared``, ``personal``, ``full``) into the network."""
        self._rt.layouts[layout].load(vector)

    def pack(self, layout: str) -> np.ndarray:
        """The network's current values of ``layout`` as a new flat float32 vector on the host."""
        return self._rt.layouts[layout].pack()

    def initial(self, layout: str) -> np.ndarray:
        """The round-0 value of a layout (every client starts from the same model)."""
        return self._rt.initial(layout)

    def tensors(self, layout: str, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """A vector of ``layout`` as named tensors on the model's device (copies)."""
        return self._rt.layouts[layout].tensors(vector)

    def vector(self, layout: str, tensors: dict[str, torch.Tensor]) -> np.ndarray:
        """Named tensors of ``layout`` as one flat float32 vector on the host (the inverse of ``tensors``)."""
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
        stored = self._rt.stored(name, self.client)
        return stored if stored is not None else np.asarray(default, np.float32)

    def set_slot(self, name: str, vector: np.ndarray | Iterable[float]) -> None:
        """Stage this client's new value of a per-client state slot (float32), kept only if the round succeeds."""
        self.slots[name] = np.asarray(vector, np.float32)

    def upload(self, name: str, vector: np.ndarray | torch.Tensor) -> None:
        """Stage this client's upload ``name`` (one of the method's ``uploads``) for the server, on its device."""
        self.uploads[name] = torch.as_tensor(vector, device=self._rt.device)

    def record(self, name: str, value: float) -> None:
        """Note one number that shows the method's mechanism in this client's round (APFL's alpha, Ditto's distance
        to the global model): it joins the client's record in metrics.jsonl, its statistics across clients in
        rounds.jsonl and W&B (``name/mean``, ...) on evaluation rounds, and ``fedsim report``'s table, as a
        module's ``self.log`` does."""
        self.recorded[name] = float(value)

    # -- training --------------------------------------------------------------------------------
    def learning_rates(self, layout: str) -> np.ndarray:
        """This round's training learning rate of every value of ``layout`` (0 for buffers)."""
        return self._rt.learning_rates(layout, self.round)

    def proximal(self, coef: float, keys: Iterable[str] | None = None) -> Penalty | None:
        """coef/2 ||w - w_now||^2 over the parameters among ``keys`` (default: the shared ones), anchored at
        their current values. None when it would be zero, so coef = 0 is plain SGD bit for bit."""
        params = self._rt.parameters()
        wanted = self._rt.layouts["shared"].keys if keys is None else keys
        live = {k: params[k] for k in wanted if k in params}
        if coef <= 0 or not live:
            return None
        return Proximal(coef, live)

    def linear(self, coefs: np.ndarray) -> LinearTerm:
        """<coefs, w> over the shared parameters: adds ``coefs`` to every gradient (SCAFFOLD's correction)."""
        params = self._rt.parameters()
        named = self.tensors("shared", coefs)
        return LinearTerm({k: c for k, c in named.items() if k in params}, {k: params[k] for k in named if k in params})

    def sgd(self, parts: frozenset[str], epochs: int, penalty: Penalty | None = None,
            after_step: StepCallback | None = None,
            data: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """``epochs`` of local training of ``parts`` on this client's data (or ``data``: a subset of it, FedFomo's
        training split); returns the per-step losses."""
        x, y = self.data() if data is None else data
        return self._rt.sgd(x, y, parts, epochs, self.generator, self.round, penalty=penalty, after_step=after_step)

    # -- for a method with an objective of its own (Algorithm.own_objective): its own steps on the network. These ---
    # -- need the worker's whole RuntimePort, so such a hook is not packable (a packed client refuses them) ---------
    def batches(self, epochs: int, data: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``epochs`` passes of training batches over this client's data (or ``data``: a subset of it, FedALA's
        sample), drawn from its generator exactly as ``sgd`` draws them (order, crops, flips)."""
        x, y = self.data() if data is None else data
        for _ in range(epochs):
            yield from self._rt.whole_runtime("steps its own batches (ctx.batches)").batches(x, y, self.generator)

    def param_groups(self, parts: frozenset[str]) -> list[dict[str, Any]]:
        """Param groups for a torch optimizer over the trainable tensors of ``parts`` (e.g. PARTS["full"]), one
        per part with this round's train.<part> settings (lr on its schedule, momentum, weight_decay): a method
        with its own steps trains as the run's config says. Scale a group's ``lr`` for a method's own step size."""
        return self._rt.whole_runtime("steps its own optimizer (ctx.param_groups)").param_groups(parts, self.round)

    @overload
    def score(self) -> tuple[float, float]: ...

    @overload
    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]: ...

    def score(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> tuple[float, float]:
        """(mean loss, accuracy) of the network as it is, in evaluation mode, on (x, y) (default: the client's
        training data): IFCA's choice of cluster, FedFomo's weighing of other clients' models."""
        if x is None:
            x, y = self.data()
        assert y is not None  # the overloads admit x and y together or neither
        return self._rt.whole_runtime("scores its model (ctx.score)").score(x, y)

    @property
    def output_layer(self) -> nn.Linear:
        """The head's last linear layer of the network."""
        return self._rt.whole_runtime("reads ctx.output_layer").output_layer

    def score_with(self, adjust: LogitAdjustment, on: AdjustedModule = "output_layer") -> None:
        """From ``load_for_evaluation``: score this client with ``adjust(input of the output layer, its logits)`` in
        place of the output layer's logits (FedRoD's generic + personal logits), or with ``on="network"``
        ``adjust(the network's input, its logits)`` (APFL's output mixture as FedTorch scores it). The runtime applies
        it while it scores this client and removes it after."""
        self.logit_adjustment, self.logit_adjustment_on = adjust, on

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the representation entering the output layer, flattened; the logits) of one forward pass: FedRoD's
        and FedProto's heads work on the representation."""
        seen: list[torch.Tensor] = []
        whole = self._rt.whole_runtime("runs its network itself (ctx.features)")
        handle = whole.output_layer.register_forward_hook(lambda _, inputs, __: seen.append(inputs[0]))
        try:
            logits = whole.net(x)
        finally:
            handle.remove()
        return seen[-1].flatten(1), logits

    def test_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This client's test images and labels on the model's device, for a method that scores a second way while
        it is scored (FedProto's nearest global prototype, recorded with ``record``)."""
        return self._rt.client_tensors(self.client, "test")

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This client's training images and labels on the model's device."""
        if self._data is None:
            self._data = self._rt.client_tensors(self.client, "train")
        return self._data
