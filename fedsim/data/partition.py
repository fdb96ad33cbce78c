"""Client partitions: which train and test samples each simulated client holds.

A partition is a pure function of (labels, arguments, seed): all randomness comes from one
``np.random.default_rng(seed)``, so a run can be reproduced, or its partition cached, exactly.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim.data.errors import DataError

# (train_y, test_y, kept train indices, kept test indices, num_clients, k, rng) -> per-client train, test
Splits = tuple[list[np.ndarray], list[np.ndarray]]
Splitter = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int | None, np.random.Generator], Splits]


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value, compare by identity
class Partition:
    train: tuple[np.ndarray, ...]  # per client: sorted int64 indices into the train arrays
    test: tuple[np.ndarray, ...]  # per client: sorted int64 indices into the test arrays

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def stats(self, train_y: np.ndarray, test_y: np.ndarray, num_classes: int) -> dict:
        """Summary for logs and run metadata; plain Python types so it serialises to JSON."""
        sizes = np.array([len(t) for t in self.train])

        def held(y: np.ndarray, parts: tuple[np.ndarray, ...]) -> list[list[int]]:
            return [np.flatnonzero(np.bincount(y[p], minlength=num_classes)).tolist() for p in parts]

        return {
            "num_clients": self.num_clients,
            "train_sizes": sizes.tolist(),
            "test_sizes": [len(t) for t in self.test],
            "classes_per_client": held(train_y, self.train),
            "test_classes_per_client": held(test_y, self.test),
            "size_mean": float(sizes.mean()),
            "size_std": float(sizes.std()),
            "size_min": int(sizes.min()),
            "size_max": int(sizes.max()),
        }

    def save(self, path: Path) -> None:
        arrays = {f"train_{i}": t for i, t in enumerate(self.train)} | {f"test_{i}": t for i, t in enumerate(self.test)}
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same folder, so os.replace is atomic
        with tmp.open("wb") as f:  # a file object stops numpy appending ".npz" to the name
            np.savez(f, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Partition:
        try:
            with np.load(path, allow_pickle=False) as z:
                n = sum(key.startswith("train_") for key in z.files)
                train = tuple(z[f"train_{i}"].astype(np.int64) for i in range(n))
                test = tuple(z[f"test_{i}"].astype(np.int64) for i in range(n))
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:  # TypeError: a bare .npy
            raise DataError(f"{path}: not a readable partition file ({e}); delete it to have it rebuilt") from e
        if n == 0 or len(z.files) != 2 * n:
            raise DataError(f"{path}: not a partition file (keys {z.files[:4]}...); delete it to have it rebuilt")
        return cls(train, test)


def _stratified_subset(y: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a random ``fraction`` of each class (at least one), so small runs stay balanced."""
    kept = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        kept.append(rng.permutation(members)[: max(1, round(fraction * len(members)))])
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, np.int64)


def _iid(train_y: np.ndarray, test_y: np.ndarray, train_pool: np.ndarray, test_pool: np.ndarray,
         num_clients: int, k: int | None, rng: np.random.Generator) -> Splits:
    train, test = ([np.sort(p) for p in np.array_split(rng.permutation(pool), num_clients)]
                   for pool in (train_pool, test_pool))
    return train, test


def _classes(train_y: np.ndarray, test_y: np.ndarray, train_pool: np.ndarray, test_pool: np.ndarray,
             num_clients: int, k: int | None, rng: np.random.Generator) -> Splits:
    """FedPer's "k classes per client"; each client is tested on exactly the classes it trains on."""
    classes = np.unique(train_y).tolist()
    if k is None or not 1 <= k <= len(classes):
        raise DataError(f"data.k: the 'classes' partition needs k in [1, {len(classes)}], got {k}")
    if num_clients * k < len(classes):
        raise DataError(f"data.k: {num_clients} clients x k={k} cannot cover {len(classes)} classes; "
                        f"raise data.k to {-(-len(classes) // num_clients)} or data.num_clients")
    # Deal a seeded permutation of the classes round-robin, so every class has a holder
    # (at most ceil(C / n) <= k per client), then top each client up to k distinct classes.
    held: list[set[int]] = [set() for _ in range(num_clients)]
    for i, c in enumerate(rng.permutation(classes).tolist()):
        held[i % num_clients].add(c)
    for h in held:
        h.update(rng.choice(sorted(set(classes) - h), k - len(h), replace=False).tolist())
    train: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    test: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders = [i for i, h in enumerate(held) if c in h]
        for y, pool, out in ((train_y, train_pool, train), (test_y, test_pool, test)):
            for client, part in zip(holders, np.array_split(rng.permutation(pool[y[pool] == c]), len(holders))):
                out[client].append(part)
    return [np.sort(np.concatenate(p)) for p in train], [np.sort(np.concatenate(p)) for p in test]


# Adding a partition kind (shards, dirichlet, ...) is one function and one entry here.
_KINDS: dict[str, Splitter] = {"iid": _iid, "classes": _classes}


def make_partition(kind: str, train_y: np.ndarray, test_y: np.ndarray, num_clients: int, seed: int, *,
                   k: int | None = None, train_fraction: float = 1.0, test_fraction: float = 1.0) -> Partition:
    """Split the (optionally subsampled) train and test sets across ``num_clients`` clients."""
    splitter = _KINDS.get(kind)
    if splitter is None:
        raise DataError(f"data.partition: unknown partition {kind!r}; choose one of {', '.join(_KINDS)}")
    if num_clients < 1:
        raise DataError(f"data.num_clients: must be at least 1, got {num_clients}")
    for field, fraction in (("train_fraction", train_fraction), ("test_fraction", test_fraction)):
        if not 0 < fraction <= 1:
            raise DataError(f"data.{field}: must be in (0, 1], got {fraction}")
    train_y, test_y = np.asarray(train_y, np.int64), np.asarray(test_y, np.int64)
    rng = np.random.default_rng(seed)
    train_pool = _stratified_subset(train_y, train_fraction, rng)
    test_pool = _stratified_subset(test_y, test_fraction, rng)
    train, test = splitter(train_y, test_y, train_pool, test_pool, num_clients, k, rng)
    for split, parts in (("train", train), ("test", test)):
        empty = next((i for i, p in enumerate(parts) if len(p) == 0), None)
        if empty is not None:
            raise DataError(f"data.num_clients: {num_clients} clients leave client {empty} with no "
                            f"{'training' if split == 'train' else 'test'} data; "
                            f"lower data.num_clients or raise data.{split}_fraction")
    return Partition(tuple(p.astype(np.int64) for p in train), tuple(p.astype(np.int64) for p in test))
