"""A client's data as the run saw it: :func:`client_tensors` gives the worker the tensors it scores (and
fine-tunes) a client on, and :func:`client_split` gives a user the same tensors out of a finished run folder, so an
exported model (``fedsim export``) is re-scored in plain torch exactly as the run scored it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim import safe_files, storage
from fedsim.config import RunConfig, load_tree, validate
from fedsim.core import runfiles
from fedsim.core.protocol import ClientData
from fedsim.data.array_dataset import ArrayDataset, recomputed_digest
from fedsim.data.datasets import load_run_data
from fedsim.data.partition import Partition
from fedsim.data.validation import validation_splits
from fedsim.errors import ConfigError, DataError
from fedsim.plugins import plugin_settings

if TYPE_CHECKING:
    import torch

SPLITS = {"train": "train", "validation": "val", "test": "test"}  # client_split's names -> ClientData's fields


def client_tensors(data: ArrayDataset, client: ClientData, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images normalised as the model sees them, labels through the client's label map) of ``client``'s ``split``
    ("train", "val" or "test"; validation is held-out training data), on the CPU."""
    import torch  # here, not above: the data package is imported (a partition checked) without torch

    from fedsim.data.transforms import to_float

    idx = {"train": client.train, "val": client.val, "test": client.test}[split]
    images = data.test_x[idx] if split == "test" else data.train_x[idx]
    labels = data.test_y[idx] if split == "test" else data.train_y[idx]
    if client.label_map is not None:
        labels = client.label_map[labels]
    return to_float(images, data.mean, data.std), torch.as_tensor(labels)


def client_split(run: str | Path, client: int, split: str,
                 trust_plugins: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): the exact tensors the run in folder ``run`` (a path or a URI) scored ``client`` on for ``split``
    ("test", "validation") or trained it on ("train"), on the CPU. The data set is loaded as the run's config names
    it; data that changed since the run started is refused. A run folder is input: a config naming code (a data
    set or module of your own) is read only with ``trust_plugins``."""
    if split not in SPLITS:
        raise ValueError(f"client_split: split {split!r} is none of {', '.join(SPLITS)}; pass one of those")
    with storage.local_folder(str(run), skip=runfiles.CHECKPOINTS) as folder:
        cfg = _run_config(folder, str(run), trust_plugins)
        partition = Partition.load(folder / runfiles.PARTITION)
        digest = _started_with(folder)
    if not 0 <= client < partition.num_clients:
        raise ValueError(f"client_split: client {client} is not a client of {run} (0 .. {partition.num_clients - 1})")
    data = load_run_data(cfg.data, cfg.seed)
    if digest and recomputed_digest(data) != digest:
        raise DataError(f"data.root: the {data.name} data changed since {run} started; restore the original files "
                        "to get the tensors the run scored")
    train, val = validation_splits(partition, data.train_y, cfg.data.validation, cfg.seed, data.window)
    maps = partition.label_maps
    held = ClientData(train[client], partition.test[client], None if maps is None else maps[client], val[client])
    return client_tensors(data, held, SPLITS[split])


def _run_config(folder: Path, run: str, trust_plugins: bool) -> RunConfig:
    tree = load_tree(folder / runfiles.CONFIG)
    named = plugin_settings(tree)
    if named and not trust_plugins:
        key, spec = next(iter(named.items()))
        raise ConfigError(f"{key}: {run}/{runfiles.CONFIG} names code to run ({spec!r}); client_split imports it only "
                          "if you trust this folder: pass trust_plugins=True")
    return validate(tree)


def _started_with(folder: Path) -> str:
    """The content digest of the data the run started on (empty: a folder from before digests, or a user's data
    set before those had one)."""
    path = folder / runfiles.DATASET
    return str(json.loads(safe_files.read_text(path)).get("digest") or "") if path.exists() else ""
