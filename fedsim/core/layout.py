"""Where each tensor of a model lives in a flat float32 vector, and which state-dict keys play which role.

Weights travel as one numpy vector because Ray moves numpy zero-copy through the object store while torch
tensors are pickled and copied (docs/stack-notes.md), and because averaging one vector is one vectorised
operation. The torch side (packing a model into a vector, loading one back) is ``fedsim.models.state`` on
the driver and ``fedsim.client.resident`` on a worker; this module holds only the arithmetic of positions.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layout:
    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # len(keys) + 1; offsets[-1] is the vector length

    @classmethod
    def of_shapes(cls, keys: list[str], shapes: list[tuple[int, ...]]) -> Layout:
        offsets = np.cumsum([0, *(int(np.prod(s)) for s in shapes)]).tolist()
        return cls(tuple(keys), tuple(tuple(s) for s in shapes), tuple(offsets))

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def spans(self) -> Iterator[tuple[str, tuple[int, ...], int, int]]:
        """(key, shape, start, end) of every tensor, in vector order."""
        return zip(self.keys, self.shapes, self.offsets, self.offsets[1:])

    def arrays(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        """Each key's values of ``vector``, shaped like its tensor (views)."""
        return {key: vector[start:end].reshape(shape) for key, shape, start, end in self.spans()}

    def gather(self, source: Layout, vector: np.ndarray) -> np.ndarray:
        """This layout's values out of ``vector`` laid out by ``source`` (a layout holding every key of this one)."""
        where = {key: (start, end) for key, _, start, end in source.spans()}
        out = np.empty(self.size, np.float32)
        for key, _, start, end in self.spans():
            a, b = where[key]
            out[start:end] = vector[a:b]
        return out


@dataclass(frozen=True)
class KeyParts:
    """State-dict keys of a model by role: base (body), personal layers (head), BatchNorm layers (``batchnorm``: their
    affine weights and running statistics; ``statistics``: the running statistics and batch counts alone)."""
    body: tuple[str, ...]
    head: tuple[str, ...]
    batchnorm: frozenset[str]
    statistics: frozenset[str] = frozenset()

    def of(self, parts: frozenset[str]) -> set[str]:
        return {k for part, keys in (("body", self.body), ("head", self.head)) if part in parts for k in keys}
