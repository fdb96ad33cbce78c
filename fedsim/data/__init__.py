"""Data layer: dataset loading with a decode-once cache, client partitions, batched transforms."""

from fedsim.data.array_dataset import ArrayDataset
from fedsim.data.client_split import client_split
from fedsim.data.datasets import load_dataset, load_run_data, resolve_root
from fedsim.data.partition import Partition
from fedsim.data.partitioning.make import make_partition
from fedsim.data.transforms import crop_flip, crop_flip_draws, random_crop_flip, shuffled_batches, to_float
from fedsim.errors import DataError

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
    "shuffled_batches",
    "to_float",
]
