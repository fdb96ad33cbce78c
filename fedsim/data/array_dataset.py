"""The data set every layer reads: NHWC arrays with their classes and channel statistics, and the content hash
a resumed run compares against the data it started on."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# The array fields, named as the cache names their files.
ARRAYS = ("train_x", "train_y", "test_x", "test_y")
GROUPS = ("train_groups", "test_groups")


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value, compare by identity
class ArrayDataset:
    name: str
    train_x: np.ndarray  # (N, H, W, C): uint8 images (a read-only memory map of the cache) or float32 features
    train_y: np.ndarray  # int64 (N,)
    test_x: np.ndarray  # (M, H, W, C), same dtype
    test_y: np.ndarray  # int64 (M,)
    classes: tuple[str, ...]
    mean: tuple[float, ...]  # per channel, over train_x, in the units ``to_float`` scales to ([0, 1] for uint8)
    std: tuple[float, ...]
    train_groups: np.ndarray | None = None  # int64 (N,): the natural client (e.g. writer) of each sample
    test_groups: np.ndarray | None = None  # int64 (M,)
    augmentable: bool = True  # whether random crop + flip keeps the label (not for letters or features)
    digest: str = ""  # hash of the arrays' content: a resumed run refuses data that changed under it
    # > 0: each group's samples are consecutive windows of one text, in order, each reading this many positions
    # (shakespeare); data.validation then holds out each client's last windows instead of a draw per class
    window: int = 0
    # How the data was built, JSON-able, for --dry-run and the run folder (shakespeare: its client count, text per
    # client and vocabulary); None: nothing beyond the arrays
    about: Mapping[str, Any] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W), the layout models see after ``to_float``."""
        _, h, w, c = self.train_x.shape
        return (c, h, w)


def content_digest(*arrays: np.ndarray | None) -> str:
    """sha256 over the arrays' dtypes, shapes and bytes (CIFAR-10's 180 MB: about half a second)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(f"{a.dtype}{a.shape}".encode())
            if a.size:  # an empty array (class folders' test set) has no bytes, and its memoryview no cast
                h.update(np.ascontiguousarray(a).data.cast("B"))  # .data: the array's memoryview
    return h.hexdigest()[:16]


def recomputed_digest(data: ArrayDataset) -> str:
    """The content hash of what training reads, from the arrays themselves (not a cache's record of it)."""
    return content_digest(*(getattr(data, a) for a in ARRAYS + GROUPS if getattr(data, a) is not None))


def about_line(about: Mapping[str, Any] | None) -> str | None:
    """``ArrayDataset.about`` in one line, its single values only (a per-client table and a vocabulary stay in the
    run folder's dataset.json): what --dry-run prints."""
    if not about:
        return None
    shown = [f"{key.replace('_', ' ')} {value:,}" if isinstance(value, int) and not isinstance(value, bool) else
             f"{key.replace('_', ' ')} {value:g}" if isinstance(value, float) else f"{key.replace('_', ' ')} {value}"
             for key, value in about.items() if isinstance(value, (int, float)) or
             (isinstance(value, str) and len(value) <= 20)]
    return ", ".join(shown) or None
