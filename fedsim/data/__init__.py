"""Data layer: dataset loading with a decode-once cache, client partitions, batched transforms.

The transforms and ``client_split`` need torch; they load on first use, so a run's data and partition can be checked
(``fedsim run`` refuses a bad split before anything imports torch) by importing this package alone."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fedsim.data.array_dataset import ArrayDataset
from fedsim.data.datasets import load_dataset, load_run_data, resolve_root
from fedsim.data.partition import Partition
from fedsim.data.partitioning.make import make_partition, run_partition
from fedsim.errors import DataError

if TYPE_CHECKING:
    from fedsim.data.client_split import client_split
    from fedsim.data.transforms import crop_flip, crop_flip_draws, random_crop_flip, shuffled_batches, to_float

_NEED_TORCH = {"client_split": "fedsim.data.client_split", "crop_flip": "fedsim.data.transforms",
               "crop_flip_draws": "fedsim.data.transforms", "random_crop_flip": "fedsim.data.transforms",
               "shuffled_batches": "fedsim.data.transforms", "to_float": "fedsim.data.transforms"}


def __getattr__(name: str) -> Any:
    if name in _NEED_TORCH:
        return getattr(import_module(_NEED_TORCH[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ArrayDataset",
    "client_split",
    "DataError",
    "Partition",
    "crop_flip",
    "crop_flip_draws",
    "load_dataset",
    "load_run_data",
    "make_partition",
    "random_crop_flip",
    "resolve_root",
    "run_partition",
    "shuffled_batches",
    "to_float",
]
