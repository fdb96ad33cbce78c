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

Windows of a text (a data set with ``window`` > 0, shakespeare) overlap their neighbours, so a random draw would
validate on text that training reads: there each client holds out its last round(f x n) windows (at least one),
in order, and its ``window`` windows just before them are not trained on either, so no training window reads the
validation text.
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


def held_out_in_order(indices: np.ndarray, fraction: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices of one client whose sorted ``indices`` are windows of one text in order: the
    last round(f x n) validate, and training stops ``window`` positions before the first of them."""
    n = len(indices)
    held = indices[n - min(max(1, _rounded(fraction * n)), n - 1):]
    return indices[indices < held[0] - window], held


def _drawn(indices: np.ndarray, labels: np.ndarray, fraction: float, seed: int,
           client: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) indices of one client, validation drawn per class from the client's own stream."""
    held = hold_out(labels, fraction, np.random.default_rng([seed, client, VALIDATION_STREAM]))
    keep = np.ones(len(indices), bool)
    keep[held] = False
    return indices[keep], indices[held]


def validation_splits(partition: Partition, train_y: np.ndarray, fraction: float, seed: int,
                      window: int = 0) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """(per client: the training indices it trains on, its validation indices). With ``fraction`` 0 the partition's
    own training indices, untouched, and no validation data; ``window`` > 0: the samples are windows of a text (the
    module docstring's last rule)."""
    if fraction == 0:
        return partition.train, tuple(np.empty(0, np.int64) for _ in partition.train)
    train, val = [], []
    for client, indices in enumerate(partition.train):
        if len(indices) < 2:
            raise DataError(f"data.validation: client {client} holds {len(indices)} training sample(s), too few to "
                            "hold any out and still train; lower data.num_clients or set data.validation: 0")
        kept, held = (held_out_in_order(indices, fraction, window) if window
                      else _drawn(indices, partition.labels(client, train_y, indices), fraction, seed, client))
        if not len(kept):
            raise DataError(f"data.validation: client {client}'s {len(indices)} training windows leave none to "
                            f"train on once its validation text and the {window} windows before it are held "
                            "out; lower data.validation or raise data.train_fraction")
        train.append(kept)
        val.append(held)
    return tuple(train), tuple(val)
