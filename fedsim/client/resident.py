"""Weights and per-client sums kept on the worker's device (the torch device it trains on).

Packing a model key by key through numpy (``fedsim.models.state.pack``) costs one blocking device-to-host
copy per tensor and a fresh host vector per client. Here a layout is bound once to the model's own tensors, so loading a
flat vector is one fused ``torch._foreach_copy_`` (the multi-tensor copy torch's optimizers use) and packing
is one more into a flat device tensor; the received global weights are moved to the device once per call,
not once per client. Host transfers that remain (personal state, which lives in host RAM, and the random
draws, which come from a CPU generator so that results do not depend on the device) are asynchronous.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from fedsim.core.aggregate import FixedPoint
from fedsim.core.layout import Layout
from fedsim.data.transforms import to_device


def host_vector(vector: np.ndarray, device: torch.device) -> torch.Tensor:
    """A flat numpy vector as a tensor on ``device``; on the CPU it shares the vector's memory (no copy)."""
    with warnings.catch_warnings():
        # Ray hands out read-only numpy views; torch only reads them (copies from them), so no copy is needed.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return to_device(torch.from_numpy(vector), device)


@dataclass(frozen=True)
class BoundLayout(Layout):
    """A :class:`Layout` bound to one model's tensors on ``device``: ``load`` and ``pack`` are one fused copy
    per dtype each, and ``pack_tensor`` leaves the result on the device."""
    model: nn.Module | None = field(default=None, compare=False, repr=False)
    device: torch.device = field(default=torch.device("cpu"), compare=False)
    # The model's own tensors, detached (copies into them are not autograd operations; a detached tensor shares
    # storage and version counter). Bind after the model's set-up (device, memory format): nothing rebinds them
    # later - optimizer steps, BatchNorm statistics and loads all write in place - so the list stays valid and
    # its versions see every change.
    targets: tuple[torch.Tensor, ...] = field(default=(), compare=False, repr=False)
    # Positions of the targets by dtype. torch fuses a multi-tensor copy (one kernel on CUDA) only when all its
    # tensors share one dtype; BatchNorm's int64 counters in the same list would send every tensor down the
    # per-tensor path (one copy each).
    groups: tuple[tuple[int, ...], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def bind(cls, layout: Layout, model: nn.Module, device: torch.device) -> BoundLayout:
        state = model.state_dict(keep_vars=True)
        return cls.over(layout, {key: state[key].detach() for key in layout.keys}, device, model)

    @classmethod
    def over(cls, layout: Layout, tensors: dict[str, torch.Tensor], device: torch.device,
             model: nn.Module | None = None) -> BoundLayout:
        """The layout bound to ``tensors`` (by key): a model's own, or a packed client's."""
        targets = tuple(tensors[key] for key in layout.keys)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(targets):
            by_dtype.setdefault(t.dtype, []).append(i)
        return cls(layout.keys, layout.shapes, layout.offsets, model, device, targets,
                   tuple(tuple(group) for group in by_dtype.values()))

    def _copy(self, destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        """One fused copy per dtype of the targets."""
        for group in self.groups:
            torch._foreach_copy_([destinations[i] for i in group], [sources[i] for i in group])

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each key's slice of a flat vector, shaped like its tensor (views: no copy)."""
        return [flat[start:end].view(shape) for shape, start, end in zip(self.shapes, self.offsets, self.offsets[1:])]

    @torch.no_grad()
    def load(self, vector: np.ndarray | torch.Tensor) -> None:
        """Copy a flat vector (numpy on the host, or a tensor on ``device``) into the bound model: fused copies,
        layouts (channels_last) and dtypes (integer buffers) converted by torch."""
        flat = vector if isinstance(vector, torch.Tensor) else host_vector(vector, self.device)
        self._copy(list(self.targets), self.views(flat))

    @torch.no_grad()
    def pack_tensor(self) -> torch.Tensor:
        """The bound model's values as a new flat float32 vector on ``device``, in logical (row-major) order."""
        out = torch.empty(self.size, dtype=torch.float32, device=self.device)
        self._copy(self.views(out), list(self.targets))
        return out

    def pack(self) -> np.ndarray:
        return self.pack_tensor().cpu().numpy()

    def tensors(self, vector: np.ndarray) -> dict[str, torch.Tensor]:
        """Each key's values as its own tensor on ``device`` (a copy of ``vector``)."""
        flat = torch.tensor(vector, dtype=torch.float32, device=self.device)
        return {key: flat[start:end].view(shape).clone() for key, shape, start, end in self.spans()}

    def vector(self, tensors: dict[str, torch.Tensor]) -> np.ndarray:
        """The inverse of ``tensors``."""
        out = np.empty(self.size, dtype=np.float32)
        for key, _, start, end in self.spans():
            out[start:end] = tensors[key].detach().reshape(-1).to("cpu", torch.float32).numpy()
        return out

    def version(self) -> int:
        """Sum of the tensors' version counters: torch bumps them on every in-place change."""
        return sum(t._version for t in self.targets)


class ExactSum:
    """A worker's running sum of its clients' weighted uploads for one round, in int64 quanta, on the worker's
    device: the arithmetic of ``fedsim.core.aggregate`` (scheme and error bound there), bit for bit.
    q = round(w * v / 2^L_t) is computed as round(v * (w * 2^-L_t)), one scalar per tensor: both are exact in
    float64 (a 24-bit float32 times a weight below 2^29, scaled by a power of two), so they are equal. The
    range test |v| <= 2^(e_t + HEADROOM_BITS) becomes |q| <= w * limit_in_quanta, equivalent for w >= 1 and
    one reduction over the scaled vector. Buffers are allocated once per round, not per client."""

    def __init__(self, scale: FixedPoint, device: torch.device):
        self.inverse_quanta = [float(np.ldexp(1.0, -int(exp))) for exp in scale.quantum_exponent]  # 2^-L_t
        self.limit = scale.limit_in_quanta()
        size = scale.offsets[-1]
        self.total = torch.zeros(size, dtype=torch.int64, device=device)
        self._scaled = torch.empty(size, dtype=torch.float64, device=device)
        self._tensors = [self._scaled[a:b] for a, b in zip(scale.offsets, scale.offsets[1:])]
        self._quanta = torch.empty_like(self.total)

    def stage(self, vector: torch.Tensor, weight: float) -> torch.Tensor:
        """Scale ``vector`` by ``weight`` (n_j or 1, times a staleness factor in an asynchronous round) to quanta
        and return, on the device, whether every value is within range (NaN and infinities are not). No host
        synchronisation: the caller reads all of a client's uploads' answers at once."""
        if vector.shape != self.total.shape:  # the guard: only the shared layout may reach the server
            raise RuntimeError(f"an upload of {vector.numel()} values where the shared part has {self.total.numel()}"
                               " - refusing a payload that could hold personal weights")
        if not vector.numel():
            return torch.ones((), dtype=torch.bool, device=self.total.device)
        self._scaled.copy_(vector)
        torch._foreach_mul_(self._tensors, [weight * inverse for inverse in self.inverse_quanta])
        low, high = torch.aminmax(self._scaled)
        return (high <= weight * self.limit) & (low >= -weight * self.limit)

    def add(self, mask: torch.Tensor | None = None) -> None:
        """Add the staged upload; with secure aggregation, masked first (``mask``: int64 words on the device, added
        with wrap-around mod 2^64, ``fedsim.privacy.secagg``), so that only masked uploads enter the total."""
        self._scaled.round_()  # half to even, as numpy's rint
        quanta = self._quanta.copy_(self._scaled)
        if mask is not None:
            quanta.add_(mask)
        self.total.add_(quanta)
