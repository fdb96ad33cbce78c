"""Client partitions: which train and test samples each simulated client holds.

A partition is a pure function of (labels, arguments, seed): all randomness comes from one
``np.random.default_rng(seed)``, so a run can be reproduced, or its partition cached, exactly.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim.errors import DataError
from fedsim.plugins import PluginError, is_plugin, load_plugin

_DIRICHLET_TRIES = 1000  # one try costs num_classes Dirichlet draws: well under a second in all


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value, compare by identity
class Partition:
    train: tuple[np.ndarray, ...]  # per client: sorted int64 indices into the train arrays
    test: tuple[np.ndarray, ...]  # per client: sorted int64 indices into the test arrays
    # Per client, int64 of length num_classes: the client's label = map[true label]. Only the
    # "conflicting" kind sets it, to give the same inputs different labels at different clients.
    label_maps: tuple[np.ndarray, ...] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def labels(self, client: int, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The labels ``client`` trains or is tested on for samples ``idx`` of label array ``y``."""
        return y[idx] if self.label_maps is None else self.label_maps[client][y[idx]]

    def stats(self, train_y: np.ndarray, test_y: np.ndarray, num_classes: int) -> dict:
        """Summary for logs and run metadata; plain Python types so it serialises to JSON."""
        sizes = np.array([len(t) for t in self.train])

        def counts(y: np.ndarray, parts: tuple[np.ndarray, ...]) -> list[np.ndarray]:
            return [np.bincount(self.labels(i, y, p), minlength=num_classes) for i, p in enumerate(parts)]

        def held(y: np.ndarray, parts: tuple[np.ndarray, ...]) -> list[list[int]]:
            return [np.flatnonzero(c).tolist() for c in counts(y, parts)]

        return {
            "num_clients": self.num_clients,
            "relabelled": self.label_maps is not None,
            "train_sizes": sizes.tolist(),
            "test_sizes": [len(t) for t in self.test],
            "classes_per_client": held(train_y, self.train),
            "test_classes_per_client": held(test_y, self.test),
            "train_class_counts": [c.tolist() for c in counts(train_y, self.train)],  # W&B's partition table
            "size_mean": float(sizes.mean()),
            "size_std": float(sizes.std()),
            "size_min": int(sizes.min()),
            "size_max": int(sizes.max()),
        }

    def save(self, path: Path) -> None:
        arrays = {f"train_{i}": t for i, t in enumerate(self.train)} | {f"test_{i}": t for i, t in enumerate(self.test)}
        arrays |= {f"label_map_{i}": m for i, m in enumerate(self.label_maps or ())}
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
                maps = tuple(z[f"label_map_{i}"].astype(np.int64) for i in range(n)) if "label_map_0" in z else None
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:  # TypeError: a bare .npy
            raise DataError(f"{path}: not a readable partition file ({e}); delete it to have it rebuilt") from e
        if n == 0 or len(z.files) != (2 if maps is None else 3) * n:
            raise DataError(f"{path}: not a partition file (keys {z.files[:4]}...); delete it to have it rebuilt")
        return cls(train, test, maps)


@dataclass(frozen=True, eq=False)
class _Request:
    """Everything a partition kind may use; each kind checks the arguments it needs."""

    train_y: np.ndarray
    test_y: np.ndarray
    num_clients: int
    rng: np.random.Generator
    train_fraction: float
    test_fraction: float
    k: int | None
    shards_per_client: int | None
    shard_style: str
    beta: float | None
    groups: tuple[np.ndarray, np.ndarray] | None
    agreed: float = 0.0

    def pools(self, strata: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The kept train and test indices: the configured fraction of every stratum (default: class).

        Every kind calls this before drawing anything else, so the subset does not depend on the kind.
        """
        train_strata, test_strata = strata or (self.train_y, self.test_y)
        return (_stratified_subset(train_strata, self.train_fraction, self.rng),
                _stratified_subset(test_strata, self.test_fraction, self.rng))


Splitter = Callable[[_Request], Partition]


def _stratified_subset(strata: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a random ``fraction`` of each stratum (at least one), so small runs stay balanced."""
    kept = []
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        kept.append(rng.permutation(members)[: max(1, round(fraction * len(members)))])
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, np.int64)


def _deal(held: list[set[int]], splits: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator,
          ) -> list[list[np.ndarray]]:
    """Split each class's samples evenly among the clients holding it, for each (labels, pool) in ``splits``.

    Returns, per split, one sorted index array per client.
    """
    out: list[list[list[np.ndarray]]] = [[[] for _ in held] for _ in splits]
    for c in sorted(set().union(*held)):
        holders = [i for i, h in enumerate(held) if c in h]
        for (y, pool), parts in zip(splits, out):
            for client, part in zip(holders, np.array_split(rng.permutation(pool[y[pool] == c]), len(holders))):
                parts[client].append(part)
    return [[np.sort(np.concatenate(p)) for p in parts] for parts in out]


def _split_by(idx: np.ndarray, weights: np.ndarray) -> list[np.ndarray]:
    """Cut ``idx`` into consecutive pieces with sizes proportional to ``weights``."""
    cuts = np.cumsum(weights)[:-1] / weights.sum() * len(idx)
    return np.split(idx, cuts.round().astype(np.int64))


def _iid(r: _Request) -> Partition:
    train, test = ([np.sort(p) for p in np.array_split(r.rng.permutation(pool), r.num_clients)] for pool in r.pools())
    return Partition(tuple(train), tuple(test))


def _classes(r: _Request) -> Partition:
    """FedPer's "k classes per client"; each client is tested on exactly the classes it trains on."""
    train_pool, test_pool = r.pools()
    classes, n, k = np.unique(r.train_y).tolist(), r.num_clients, r.k
    if k is None or not 1 <= k <= len(classes):
        raise DataError(f"data.partition.k: the 'classes' partition needs k in [1, {len(classes)}], got {k}")
    if n * k < len(classes):
        raise DataError(f"data.partition.k: {n} clients x k={k} cannot cover {len(classes)} classes; "
                        f"raise data.partition.k to {-(-len(classes) // n)} or data.num_clients")
    # Deal a seeded permutation of the classes round-robin, so every class has a holder
    # (at most ceil(C / n) <= k per client), then top each client up to k distinct classes.
    held: list[set[int]] = [set() for _ in range(n)]
    for i, c in enumerate(r.rng.permutation(classes).tolist()):
        held[i % n].add(c)
    for h in held:
        h.update(r.rng.choice(sorted(set(classes) - h), k - len(h), replace=False).tolist())
    train, test = _deal(held, [(r.train_y, train_pool), (r.test_y, test_pool)], r.rng)
    return Partition(tuple(train), tuple(test))


def _shards(r: _Request) -> Partition:
    """Shards: each client holds ``shards_per_client`` shards of train data, in one of two styles."""
    s = r.shards_per_client
    if s is None or s < 1:
        raise DataError(f"data.partition.shards_per_client: the 'shards' partition needs shards_per_client >= 1, got {s}; "
                        "set it (FedBABU's scripts use 10, 50 and 100 with 100 clients)")
    style = _SHARD_STYLES.get(r.shard_style)
    if style is None:
        raise DataError(f"data.partition.style: unknown shard style {r.shard_style!r}; choose one of "
                        f"{', '.join(_SHARD_STYLES)}")
    return style(r)


def _fedbabu_shards(r: _Request) -> Partition:
    """FedBABU's ``noniid`` (jhoon-oh/FedBABU, utils/sampling.py): single-class shards; test drawn like train.

    Each of the C classes is cut into P = n*s/C shards (sizes differ by at most one within a class,
    as in the authors' code). The class list, each class repeated P times, is shuffled and dealt s to
    a client, so a client may draw one class twice (the authors' code allows it too); the client
    gets a random unused shard of every class it drew. Its test set is drawn with the same class
    list from test shards that all hold m = min over classes of (test samples // P) samples: every
    client's test set has its train class mix and holds s*m samples. The authors' code spreads
    each class's test remainder over its first shards instead; with their dataset sizes there is
    none. We drop it (fewer than P samples per class) to keep test sizes equal for any fraction.
    Two more differences, neither changing the distribution on CIFAR: their shards are runs of a
    class's indices in file order, ours runs of a seeded shuffle (a dataset stored grouped, e.g. by
    writer, would otherwise give grouped shards); their class list is shuffled by Python's
    ``random``, which their scripts never seed, ours by the run's seed.
    """
    train_pool, test_pool = r.pools()
    s, n = r.shards_per_client, r.num_clients
    train_by_class = _members_by_class(r.train_y, train_pool)
    test_by_class = _members_by_class(r.test_y, test_pool)
    per_class = _fedbabu_shards_per_class(s, n, train_by_class, test_by_class)
    drawn = r.rng.permutation(np.repeat(list(train_by_class), per_class)).reshape(n, s)
    train_shards = {c: np.array_split(r.rng.permutation(members), per_class) for c, members in train_by_class.items()}
    test_size = min(len(test_by_class[c]) for c in train_by_class) // per_class
    test_shards = {c: r.rng.permutation(test_by_class[c])[: per_class * test_size].reshape(per_class, test_size)
                   for c in train_by_class}
    train, test = (_hand_out(drawn, shards, r.rng) for shards in (train_shards, test_shards))
    return Partition(tuple(train), tuple(test))


def _members_by_class(y: np.ndarray, pool: np.ndarray) -> dict[int, np.ndarray]:
    """The pool's indices of each class present in it, classes in increasing order."""
    return {c: pool[y[pool] == c] for c in np.unique(y[pool]).tolist()}


def _fedbabu_shards_per_class(s: int, n: int, train_by_class: dict[int, np.ndarray],
                              test_by_class: dict[int, np.ndarray]) -> int:
    """P = n*s/C, after checking that every class can be cut into P non-empty train and test shards.

    The authors' code floors n*s/C; when C does not divide n*s their reshape to (n, -1) either fails
    or silently deals fewer than s shards, so we refuse those numbers.
    """
    num_classes = len(train_by_class)
    if n * s % num_classes:
        step = num_classes // math.gcd(n, num_classes)
        raise DataError(f"data.partition.shards_per_client: FedBABU-style shards cut each of the {num_classes} classes into "
                        f"num_clients x shards_per_client / {num_classes} shards, and {n} x {s} is not a multiple "
                        f"of {num_classes}; set data.partition.shards_per_client to a multiple of {step} (e.g. "
                        f"{-(-s // step) * step}) or data.partition.style: sorted_pool")
    per_class = n * s // num_classes
    missing = sorted(set(train_by_class) - set(test_by_class))
    if missing:
        raise DataError(f"data.partition.style: FedBABU-style shards test each client on its train classes, but the "
                        f"test split has no samples of classes {missing[:5]}; use data.partition.style: sorted_pool")
    for split, by_class in (("train", train_by_class), ("test", test_by_class)):
        fewest = min(len(by_class[c]) for c in train_by_class)
        if fewest < per_class:
            raise DataError(f"data.{split}_fraction: a class keeps only {fewest} {split} samples for its {per_class} "
                            f"shards (num_clients x shards_per_client / {num_classes}); raise data.{split}_fraction "
                            "or lower data.num_clients or data.partition.shards_per_client")
    return per_class


def _hand_out(drawn: np.ndarray, shards: dict[int, list[np.ndarray] | np.ndarray],
              rng: np.random.Generator) -> list[np.ndarray]:
    """Give each client (a row of ``drawn`` class labels) a random unused shard of every class in its row."""
    unused = {c: iter(rng.permutation(len(class_shards)).tolist()) for c, class_shards in shards.items()}
    return [np.sort(np.concatenate([shards[c][next(unused[c])] for c in row])) for row in drawn.tolist()]


def _sorted_pool_shards(r: _Request) -> Partition:
    """fedsim's shards before FedBABU's style: label-sorted train pool cut into n*s shards, s random per client.

    A shard may straddle two classes. Each client is tested on the classes its shards hold, each
    class's test samples split evenly among its holders, as in the "classes" kind.
    """
    train_pool, test_pool = r.pools()
    s, n = r.shards_per_client, r.num_clients
    if s * n > len(train_pool):
        raise DataError(f"data.partition.shards_per_client: the 'shards' partition needs num_clients x shards_per_client <= "
                        f"{len(train_pool)} train samples, got {s}; lower it or data.num_clients")
    shuffled = r.rng.permutation(train_pool)  # then a stable sort: shuffled within each class
    shards = np.array_split(shuffled[np.argsort(r.train_y[shuffled], kind="stable")], n * s)
    train = [np.sort(np.concatenate([shards[j] for j in own])) for own in r.rng.permutation(n * s).reshape(n, s)]
    held = [set(np.unique(r.train_y[t]).tolist()) for t in train]
    (test,) = _deal(held, [(r.test_y, test_pool)], r.rng)
    return Partition(tuple(train), tuple(test))


_SHARD_STYLES: dict[str, Splitter] = {"fedbabu": _fedbabu_shards, "sorted_pool": _sorted_pool_shards}


def _dirichlet(r: _Request) -> Partition:
    """Label skew (Hsu et al. 2019): each class spread over clients by proportions ~ Dir(beta * 1).

    Client sizes come out unequal. Each client's test set repeats its train class mix: a class's
    test samples go to clients in proportion to their train counts of that class. Draws repeat
    until every client has >= 2 train and >= 1 test samples.
    """
    train_pool, test_pool = r.pools()
    n, beta = r.num_clients, r.beta
    if beta is None or not beta > 0:
        raise DataError(f"data.partition.beta: the 'dirichlet' partition needs beta > 0 (0.1 = strong skew, 100 = near "
                        f"IID), got {beta}")
    by_class = [(train_pool[r.train_y[train_pool] == c], test_pool[r.test_y[test_pool] == c])
                for c in np.unique(r.train_y[train_pool])]
    for _ in range(_DIRICHLET_TRIES):
        train: list[list[np.ndarray]] = [[] for _ in range(n)]
        test: list[list[np.ndarray]] = [[] for _ in range(n)]
        for tr, te in by_class:
            pieces = _split_by(r.rng.permutation(tr), r.rng.dirichlet(np.full(n, beta)))
            counts = np.array([len(p) for p in pieces])
            for client, (a, b) in enumerate(zip(pieces, _split_by(r.rng.permutation(te), counts))):
                train[client].append(a)
                test[client].append(b)
        train_parts, test_parts = ([np.sort(np.concatenate(p)) for p in split] for split in (train, test))
        if min(map(len, train_parts)) >= 2 and min(map(len, test_parts)) >= 1:
            return Partition(tuple(train_parts), tuple(test_parts))
    raise DataError(f"data.partition.beta: beta={beta} left some of the {n} clients under 2 train or 1 test samples in "
                    f"{_DIRICHLET_TRIES} draws; raise data.partition.beta or lower data.num_clients")


def _conflicting(r: _Request) -> Partition:
    """Same inputs, different labels per client (a stand-in for FLICKR-AES's per-user ratings).

    Each client samples len(pool) // n train and test indices without replacement, independently
    of the others (so clients overlap), and relabels them by its own class permutation. The first
    A = round(agreed x C) classes (rounded half up) keep their true label at every client; the other
    M = C - A are permuted among themselves, the permutations forming a Latin square (client j: class
    A + i gets label A + pi[(i + shift_j) mod M], the shifts a seeded permutation of 0..M-1 repeated):
    over any M consecutive clients every permuted class receives every permuted label exactly once, so
    users disagree on those classes as much as possible. At agreed = 0 (A = 0) no single model beats
    chance; at agreed > 0 a shared model can still learn the A agreed classes.
    """
    train, test = ([np.sort(r.rng.choice(pool, len(pool) // r.num_clients, replace=False))
                    for _ in range(r.num_clients)] for pool in r.pools())
    num_classes = int(max(r.train_y.max(initial=0), r.test_y.max(initial=0))) + 1
    if not 0 <= r.agreed < 1:
        raise DataError(f"data.partition.agreed: the fraction of classes every client labels alike must be in [0, 1), "
                        f"got {r.agreed}")
    agreed = math.floor(r.agreed * num_classes + 0.5)
    permuted = num_classes - agreed
    if r.agreed > 0 and permuted < 2:
        raise DataError(f"data.partition.agreed: {r.agreed} of {num_classes} classes leaves {permuted} to permute, so "
                        f"the clients would all agree; lower data.partition.agreed to at most "
                        f"{(num_classes - 2) / num_classes:g}")
    # Drawn exactly as before agreed existed, so agreed = 0 gives the same maps from the same seed.
    base, shifts = r.rng.permutation(permuted), r.rng.permutation(permuted)
    classes = np.arange(permuted)
    maps = tuple(np.concatenate([np.arange(agreed), agreed + base[(classes + shifts[j % permuted]) % permuted]])
                 for j in range(r.num_clients))
    return Partition(tuple(train), tuple(test), maps)


def _natural(r: _Request) -> Partition:
    """One client per group (e.g. FEMNIST writer); with fewer clients, the groups with most train data.

    The data fractions apply per client, so every kept client keeps at least one sample.
    """
    if r.groups is None:
        raise DataError("data.partition: natural needs a dataset with per-sample client ids, e.g. femnist")
    train_g, test_g = (np.asarray(g, np.int64) for g in r.groups)
    if train_g.shape != r.train_y.shape or test_g.shape != r.test_y.shape:
        raise DataError(f"data.partition: natural got {len(train_g)}/{len(test_g)} client ids for "
                        f"{len(r.train_y)}/{len(r.test_y)} train/test samples; the dataset's groups are broken")
    train_pool, test_pool = r.pools((train_g, test_g))
    ids, counts = np.unique(train_g, return_counts=True)
    if r.num_clients > len(ids):
        raise DataError(f"data.num_clients: this dataset has {len(ids)} natural clients, got {r.num_clients}; "
                        f"set data.num_clients <= {len(ids)}")
    chosen = np.sort(ids[np.lexsort((ids, -counts))[: r.num_clients]])  # most train samples, ties by lower id
    train, test = ([pool[g[pool] == c] for c in chosen] for g, pool in ((train_g, train_pool), (test_g, test_pool)))
    return Partition(tuple(train), tuple(test))


# Adding a partition kind is one function and one entry here.
_KINDS: dict[str, Splitter] = {"iid": _iid, "classes": _classes, "shards": _shards, "dirichlet": _dirichlet,
                               "conflicting": _conflicting, "natural": _natural}


def _user_partition(spec: str) -> Splitter:
    """``data.partition: package.module:function``, called as function(train_y, test_y, num_clients, rng)
    and returning (train index arrays, test index arrays), one of each per client."""
    try:
        split = load_plugin(spec, "data.partition")
    except PluginError as err:
        raise DataError(str(err)) from None

    def splitter(r: _Request) -> Partition:
        train, test = split(r.train_y, r.test_y, r.num_clients, r.rng)
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
    splitter = _user_partition(kind) if is_plugin(kind) else _KINDS.get(kind)
    if splitter is None:
        raise DataError(f"data.partition: unknown partition {kind!r}; choose one of {', '.join(_KINDS)}")
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
    p = splitter(_Request(np.asarray(train_y, np.int64), np.asarray(test_y, np.int64), num_clients,
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
