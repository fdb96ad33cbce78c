"""Data layer: dataset loading with a decode-once cache, client partitions, batched transforms.

The transforms need torch; they load on first use, so a run's data and partition can be checked
(``fedsim run`` refuses a bad split before anything imports torch) by importing this package alone."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fedsim.data.array_dataset import ArrayDataset
from fedsim.data.client_split import client_split
from fedsim.data.datasets import load_dataset, load_run_data, resolve_root
from fedsim.data.partition import Partition
from fedsim.data.partitioning.make import make_partition, run_partition
from fedsim.errors import DataError

if TYPE_CHECKING:
    from fedsim.data.transforms import crop_flip, crop_flip_draws, random_crop_flip, shuffled_batches, to_float

_TRANSFORMS = {"crop_flip", "crop_flip_draws", "random_crop_flip", "shuffled_batches", "to_float"}  # torch's


def __getattr__(name: str) -> Any:
    if name in _TRANSFORMS:
        return getattr(import_module("fedsim.data.transforms"), name)
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
