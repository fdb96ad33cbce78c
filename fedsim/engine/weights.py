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


    def tensors(self, vector: np.ndarray, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Each key's values as its own tensor on ``device`` (a copy of ``vector``)."""
        flat = torch.tensor(vector, dtype=torch.float32, device=device)
        return {key: flat[start:end].view(shape).clone()
                for key, shape, start, end in zip(self.keys, self.shapes, self.offsets, self.offsets[1:])}

    def vector(self, tensors: dict[str, torch.Tensor]) -> np.ndarray:
        """The inverse of ``tensors``."""
        out = np.empty(self.size, dtype=np.float32)
        for key, start, end in zip(self.keys, self.offsets, self.offsets[1:]):
            out[start:end] = tensors[key].detach().reshape(-1).to("cpu", torch.float32).numpy()
        return out


class VectorStore:
    """Per-client flat vectors of one length, kept as rows of large preallocated blocks.

    One small numpy array per client costs a header and its own malloc chunk, interleaved with the
    round's transient buffers: measured 10.6-13.0 KB per 10.3 KB FedPer head. Rows of ~4 MB blocks
    cost the vector alone, and untouched rows of a block cost no resident memory at all."""

    BLOCK_BYTES = 4 << 20

    def __init__(self, size: int):
        self.size = size
        self.rows_per_block = max(1, self.BLOCK_BYTES // max(4 * size, 1))
        self._blocks: list[np.ndarray] = []
        self._row: dict[int, int] = {}  # client -> row number, in first-stored order

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, client: int) -> bool:
        return client in self._row

    def __getitem__(self, client: int) -> np.ndarray:
        return self._view(self._row[client])

    def get(self, client: int, default: np.ndarray) -> np.ndarray:
        return self[client] if client in self._row else default

    def __setitem__(self, client: int, vector: np.ndarray) -> None:
        if client not in self._row:
            row = self._row[client] = len(self._row)
            if row // self.rows_per_block == len(self._blocks):
                self._blocks.append(np.empty((self.rows_per_block, self.size), np.float32))
        block, index = divmod(self._row[client], self.rows_per_block)
        self._blocks[block][index] = vector

    def items(self):
        return ((client, self._view(row)) for client, row in self._row.items())

    def _view(self, row: int) -> np.ndarray:
        block, index = divmod(row, self.rows_per_block)
        view = self._blocks[block][index]
        view.flags.writeable = False  # callers read; writes go through __setitem__
        return view
