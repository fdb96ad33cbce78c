"""Flat float32 vectors for a subset of a model's state (parameters and buffers).

Weights travel as one numpy vector because Ray moves numpy zero-copy through the object store
while torch tensors are pickled and copied (see ../shared/NOTES-stack.md), and because
averaging one vector is one vectorised operation.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Layout:
    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # len(keys) + 1; offsets[-1] is the vector length

    @classmethod
    def of(cls, model: nn.Module, keys: list[str]) -> "Layout":
        state = model.state_dict()
        shapes = tuple(tuple(state[k].shape) for k in keys)
        offsets = np.cumsum([0, *(int(np.prod(s)) for s in shapes)]).tolist()
        return cls(tuple(keys), shapes, tuple(offsets))

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def pack(self, model: nn.Module) -> np.ndarray:
        state = model.state_dict()
        out = np.empty(self.size, dtype=np.float32)
        for key, start, end in zip(self.keys, self.offsets, self.offsets[1:]):
            out[start:end] = state[key].detach().reshape(-1).to("cpu", torch.float32).numpy()
        return out

    @torch.no_grad()
    def unpack_into(self, model: nn.Module, vector: np.ndarray) -> None:
        state = model.state_dict(keep_vars=True)
        with warnings.catch_warnings():
            # Ray hands out read-only numpy views; torch only reads this one (copy_ below), so no copy is needed.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            flat = torch.from_numpy(vector)
        for key, shape, start, end in zip(self.keys, self.shapes, self.offsets, self.offsets[1:]):
            target = state[key]
            target.copy_(flat[start:end].view(shape).to(target.dtype))
