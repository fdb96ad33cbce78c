"""The partition kinds: each a function of a ``Request`` that draws every client's train and test samples.

Adding a partition kind is one function here and one entry in ``KINDS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from fedsim.data.partition import Partition
from fedsim.data.partitioning.request import Request, Splitter
from fedsim.errors import DataError

_DIRICHLET_TRIES = 1000  # one try costs num_classes Dirichlet draws: well under a second in all


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


def _iid(r: Request) -> Partition:
    train, test = ([np.sort(p) for p in np.array_split(r.rng.permutation(pool), r.num_clients)] for pool in r.pools())
    return Partition(tuple(train), tuple(test))


def _classes(r: Request) -> Partition:
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


def _shards(r: Request) -> Partition:
    """Shards: each client holds ``shards_per_client`` shards of train data, in one of two styles."""
    s = r.shards_per_client
    if s is None or s < 1:
        raise DataError(f"data.partition.shards_per_client: the 'shards' partition needs shards_per_client >= 1, got {s}; "
                        "set it (FedBABU's scripts use 10, 50 and 100 with 100 clients)")
    style = _SHARD_STYLES.get(r.shard_style)
    if style is None:
        raise DataError(f"data.partition.style: unknown shard style {r.shard_style!r}; choose one of "
                        f"{', '.join(_SHARD_STYLES)}")
    return style(r, s)


def _fedbabu_shards(r: Request, s: int) -> Partition:
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
    n = r.num_clients
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


def _hand_out(drawn: np.ndarray, shards: Mapping[int, list[np.ndarray] | np.ndarray],
              rng: np.random.Generator) -> list[np.ndarray]:
    """Give each client (a row of ``drawn`` class labels) a random unused shard of every class in its row."""
    unused = {c: iter(rng.permutation(len(class_shards)).tolist()) for c, class_shards in shards.items()}
    return [np.sort(np.concatenate([shards[c][next(unused[c])] for c in row])) for row in drawn.tolist()]


def _sorted_pool_shards(r: Request, s: int) -> Partition:
    """fedsim's shards before FedBABU's style: label-sorted train pool cut into n*s shards, s random per client.

    A shard may straddle two classes. Each client is tested on the classes its shards hold, each
    class's test samples split evenly among its holders, as in the "classes" kind.
    """
    train_pool, test_pool = r.pools()
    n = r.num_clients
    if s * n > len(train_pool):
        raise DataError(f"data.partition.shards_per_client: the 'shards' partition needs num_clients x shards_per_client <= "
                        f"{len(train_pool)} train samples, got {s}; lower it or data.num_clients")
    shuffled = r.rng.permutation(train_pool)  # then a stable sort: shuffled within each class
    shards = np.array_split(shuffled[np.argsort(r.train_y[shuffled], kind="stable")], n * s)
    train = [np.sort(np.concatenate([shards[j] for j in own])) for own in r.rng.permutation(n * s).reshape(n, s)]
    held = [set(np.unique(r.train_y[t]).tolist()) for t in train]
    (test,) = _deal(held, [(r.test_y, test_pool)], r.rng)
    return Partition(tuple(train), tuple(test))


# A shard style draws from the request and its shards_per_client, checked present by _shards.
_SHARD_STYLES: dict[str, Callable[[Request, int], Partition]] = {"fedbabu": _fedbabu_shards,
                                                                  "sorted_pool": _sorted_pool_shards}


def _dirichlet(r: Request) -> Partition:
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


def _conflicting(r: Request) -> Partition:
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


def _natural(r: Request) -> Partition:
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


KINDS: dict[str, Splitter] = {"iid": _iid, "classes": _classes, "shards": _shards, "dirichlet": _dirichlet,
                              "conflicting": _conflicting, "natural": _natural}
