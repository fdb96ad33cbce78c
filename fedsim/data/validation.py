"""``data.validation``: a fraction of each client's training data held out as its validation split, what every
selection (best round, ASHA, time to accuracy, tuning) reads so that none is made on the test set.

Drawn after partitioning, on each client's own training indices, so it holds for every data set and partition, a
user's too. Each client's draw comes from a stream of its own, ``(seed, client, VALIDATION_STREAM)``: nothing else's
randomness shifts, and a client's split does not depend on the other clients. The rule, per client with n training
samples (counts rounded half up):

- each class the client holds n_c >= 2 samples of gives round(f x n_c) of them, at most n_c - 1 (one stays to train);
- the samples of classes it holds only once are pooled, and round(f x pool) of them drawn at random (never so many
  that nothing would be left to train);
- a client that would hold out nothing (few samples, small f) holds out one sample, drawn at random, so that every
  client is scored on validation data; a client with a single training sample cannot and is refused.
"""
from __future__ import annotations

import numpy as np

from fedsim.data.partition import Partition
from fedsim.errors import DataError

VALIDATION_STREAM = 0x7A11D  # the validation split's own stream beside the seed and the client


def _rounded(x: float) -> int:
    """Half up (Python's round goes to even: round(0.5) == 0)."""
    return int(np.floor(x + 0.5))


def hold_out(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Positions (into ``labels``, one client's training labels) of its validation samples, sorted; the module
    docstring states the rule."""
    n = len(labels)
    classes, counts = np.unique(labels, return_counts=True)
    chosen: list[np.ndarray] = []
    for c, n_c in zip(classes, counts):
        if n_c >= 2:
            chosen.append(rng.choice(np.flatnonzero(labels == c), size=min(_rounded(fraction * n_c), n_c - 1),
                                     replace=False))
    pool = np.flatnonzero(np.isin(labels, classes[counts == 1]))
    room = n - 1 - sum(len(part) for part in chosen)  # at least one sample stays to train
    chosen.append(rng.choice(pool, size=min(_rounded(fraction * len(pool)), room), replace=False))
    held = np.concatenate(chosen).astype(np.int64)
    if len(held) == 0:
        held = rng.choice(n, size=1, replace=False).astype(np.int64)
    return np.sort(held)


def validation_splits(partition: Partition, train_y: np.ndarray, fraction: float,
                      seed: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """(per client: the training indices it trains on, its validation indices). With ``fraction`` 0 the partition's
    own training indices, untouched, and no validation data."""
    if fraction == 0:
        return partition.train, tuple(np.empty(0, np.int64) for _ in partition.train)
    train, val = [], []
    for client, indices in enumerate(partition.train):
        if len(indices) < 2:
            raise DataError(f"data.validation: client {client} holds {len(indices)} training sample(s), too few to "
                            "hold any out and still train; lower data.num_clients or set data.validation: 0")
        rng = np.random.default_rng([seed, client, VALIDATION_STREAM])
        held = hold_out(partition.labels(client, train_y, indices), fraction, rng)
        keep = np.ones(len(indices), bool)
        keep[held] = False
        train.append(indices[keep])
        val.append(indices[held])
    return tuple(train), tuple(val)
