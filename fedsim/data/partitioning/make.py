"""``make_partition``: the arguments checked, the kind (built-in or a user's ``package.module:function``) drawn
from the seed, and every client's split checked non-empty."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedsim.data.partition import Partition
from fedsim.data.partitioning.kinds import KINDS
from fedsim.data.partitioning.request import Request, Splitter
from fedsim.errors import DataError, PluginError
from fedsim.plugins import Signature, is_plugin, load_plugin, user_call

if TYPE_CHECKING:
    from fedsim.config import DataConfig
    from fedsim.data.array_dataset import ArrayDataset

USER_PARTITION = Signature(("train_y", "test_y", "num_clients", "rng"),
                           returns="(train index arrays, test index arrays), one of each per client")


def _user_partition(spec: str) -> Splitter:
    """``data.partition: package.module:function``, called as ``USER_PARTITION`` says."""
    try:
        split = load_plugin(spec, "data.partition", USER_PARTITION)
    except PluginError as err:
        raise DataError(str(err)) from None

    def splitter(r: Request) -> Partition:
        try:
            with user_call(spec, "data.partition", USER_PARTITION):
                train, test = split(r.train_y, r.test_y, r.num_clients, r.rng)
        except PluginError as err:
            raise DataError(str(err)) from None
        return Partition(tuple(np.sort(np.asarray(t, np.int64)) for t in train),
                         tuple(np.sort(np.asarray(t, np.int64)) for t in test))

    return splitter


def make_partition(kind: str, train_y: np.ndarray, test_y: np.ndarray, num_clients: int, seed: int, *,
                   k: int | None = None, train_fraction: float = 1.0, test_fraction: float = 1.0,
                   shards_per_client: int | None = None, shard_style: str = "fedbabu", beta: float | None = None,
                   groups: tuple[np.ndarray, np.ndarray] | None = None, agreed: float = 0.0) -> Partition:
    """Split the (optionally subsampled) train and test sets across ``num_clients`` clients.

    ``groups`` holds per-sample client ids (train, test) for the "natural" kind; each kind
    ignores the arguments it does not use.
    """
    splitter = _user_partition(kind) if is_plugin(kind) else KINDS.get(kind)
    if splitter is None:
        raise DataError(f"data.partition: unknown partition {kind!r}; choose one of {', '.join(KINDS)}")
    if num_clients < 1:
        raise DataError(f"data.num_clients: must be at least 1, got {num_clients}")
    for field, fraction in (("train_fraction", train_fraction), ("test_fraction", test_fraction)):
        if not 0 < fraction <= 1:
            raise DataError(f"data.{field}: must be in (0, 1], got {fraction}")
    # Checked before splitting: every client needs a sample of each split, and a huge count (10^9) would
    # otherwise allocate per-client arrays until memory runs out.
    for split, labels in (("train", train_y), ("test", test_y)):
        if num_clients > len(labels):
            raise DataError(f"data.num_clients: {num_clients} clients but the data set has only {len(labels)} "
                            f"{split} samples; lower data.num_clients")
    p = splitter(Request(np.asarray(train_y, np.int64), np.asarray(test_y, np.int64), num_clients,
                         np.random.default_rng(seed), train_fraction, test_fraction, k, shards_per_client,
                         shard_style, beta, groups, agreed))
    for split, parts in (("train", p.train), ("test", p.test)):
        empty = next((i for i, part in enumerate(parts) if len(part) == 0), None)
        if empty is not None:
            raise DataError(f"data.num_clients: {num_clients} clients leave client {empty} with no "
                            f"{'training' if split == 'train' else 'test'} data; "
                            f"lower data.num_clients or raise data.{split}_fraction")
    return Partition(tuple(t.astype(np.int64) for t in p.train), tuple(t.astype(np.int64) for t in p.test),
                     p.label_maps)


def run_partition(d: DataConfig, seed: int, data: ArrayDataset) -> Partition:
    """The partition a run of data config ``d`` trains over, drawn from ``data`` (``load_run_data(d, seed)``)."""
    groups = (None if data.train_groups is None or data.test_groups is None  # a dataset has both or neither
              else (data.train_groups, data.test_groups))
    return make_partition(d.partition.name, data.train_y, data.test_y, d.num_clients, seed, groups=groups,
                          train_fraction=d.train_fraction, test_fraction=d.test_fraction, **d.partition.arguments())
