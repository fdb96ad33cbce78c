"""Tests for the federated partition kinds: shards, dirichlet, conflicting, natural."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from fedsim.data import DataError, Partition, load_dataset, make_partition
from fedsim.data.partitioning import kinds

TRAIN_Y = np.repeat(np.arange(10), 60)  # 10 classes x 60
TEST_Y = np.repeat(np.arange(10), 20)


def classes_of(y: np.ndarray, idx: np.ndarray) -> set[int]:
    return set(np.unique(y[idx]).tolist())


def assert_disjoint_and_complete(parts: tuple[np.ndarray, ...], n: int) -> None:
    together = np.concatenate(parts)
    assert len(np.unique(together)) == len(together) == n


def assert_same(a: Partition, b: Partition) -> None:
    assert all(np.array_equal(x, y) for x, y in zip(a.train + a.test, b.train + b.test))
    assert (a.label_maps is None) == (b.label_maps is None)
    assert all(np.array_equal(x, y) for x, y in zip(a.label_maps or (), b.label_maps or ()))


# --------------------------------------------------------------------------- shards (FedBABU style)


def fedbabu_shard_counts(p: Partition, train_y: np.ndarray, test_y: np.ndarray, m: int,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Per client and class: train counts, and shards drawn (test counts / the common test shard size m)."""
    train_counts = np.stack([np.bincount(train_y[t], minlength=10) for t in p.train])
    test_counts = np.stack([np.bincount(test_y[t], minlength=10) for t in p.test])
    assert np.all(test_counts % m == 0)
    return train_counts, test_counts // m


@pytest.mark.parametrize("num_clients,s,seed,train_fraction,test_fraction",
                         [(10, 3, 0, 1.0, 1.0), (5, 2, 1, 1.0, 1.0), (30, 1, 2, 1.0, 1.0), (4, 15, 3, 1.0, 1.0),
                          (5, 4, 4, 0.5, 0.5), (20, 5, 5, 1.0, 0.5)])
def test_fedbabu_shards_are_single_class_and_tests_mirror_train(num_clients: int, s: int, seed: int,
                                                                train_fraction: float, test_fraction: float) -> None:
    p = make_partition("shards", TRAIN_Y, TEST_Y, num_clients, seed, shards_per_client=s,
                       train_fraction=train_fraction, test_fraction=test_fraction)
    per_class = num_clients * s // 10
    kept_train, kept_test = round(60 * train_fraction), round(20 * test_fraction)
    shard, m = kept_train // per_class, kept_test // per_class  # chosen so that shard divides kept_train
    assert shard * per_class == kept_train
    assert_disjoint_and_complete(p.train, 10 * kept_train)  # every kept train sample is in exactly one shard
    assert len(np.unique(np.concatenate(p.test))) == sum(map(len, p.test))
    train_counts, shards_drawn = fedbabu_shard_counts(p, TRAIN_Y, TEST_Y, m)
    assert np.array_equal(train_counts, shards_drawn * shard)  # whole single-class shards, none straddling
    assert np.all(shards_drawn.sum(axis=1) == s)  # exactly s shards per client
    assert np.all(shards_drawn.sum(axis=0) == per_class)  # every shard of every class handed out once
    assert [len(t) for t in p.test] == [s * m] * num_clients  # equal test sizes, the train class mix
    assert 10 * per_class * m == sum(map(len, p.test)) <= 10 * kept_test  # only the remainder (< per_class) dropped


def test_fedbabu_shards_of_unequal_classes() -> None:
    """Uneven class sizes: a class's shards differ by at most one sample; test shards all share one size."""
    rng = np.random.default_rng(11)
    train_y = np.repeat(np.arange(10), rng.integers(40, 90, 10))
    test_y = np.repeat(np.arange(10), rng.integers(15, 40, 10))
    p = make_partition("shards", train_y, test_y, 8, 3, shards_per_client=5)  # 4 shards per class
    assert_disjoint_and_complete(p.train, len(train_y))
    train_counts, shards_drawn = fedbabu_shard_counts(p, train_y, test_y, np.bincount(test_y).min() // 4)
    assert np.all(shards_drawn.sum(axis=1) == 5) and np.all(shards_drawn.sum(axis=0) == 4)
    low = np.bincount(train_y) // 4
    assert np.all(train_counts >= shards_drawn * low) and np.all(train_counts <= shards_drawn * (low + 1))
    assert len({len(t) for t in p.test}) == 1


def test_fedbabu_shards_are_a_pure_function_of_the_seed() -> None:
    a = make_partition("shards", TRAIN_Y, TEST_Y, 10, 7, shards_per_client=2, test_fraction=0.5)
    assert_same(a, make_partition("shards", TRAIN_Y, TEST_Y, 10, 7, shards_per_client=2, test_fraction=0.5,
                                  shard_style="fedbabu"))
    b = make_partition("shards", TRAIN_Y, TEST_Y, 10, 8, shards_per_client=2, test_fraction=0.5)
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, b.train))


def test_fedbabu_shards_suggest_a_count_that_works() -> None:
    with pytest.raises(DataError, match=r"^data\.partition\.shards_per_client: .*7 x 2 is not a multiple of 10") as info:
        make_partition("shards", TRAIN_Y, TEST_Y, 7, 0, shards_per_client=2)
    suggested = int(re.search(r"e\.g\. (\d+)", str(info.value)).group(1))
    assert suggested == 10
    assert make_partition("shards", TRAIN_Y, TEST_Y, 7, 0, shards_per_client=suggested).num_clients == 7


# --------------------------------------------------------------------------- shards (sorted pool)


@pytest.mark.parametrize("num_clients,s,seed", [(10, 3, 0), (5, 2, 1), (30, 1, 2), (4, 15, 3)])
def test_sorted_pool_shards(num_clients: int, s: int, seed: int) -> None:
    # 60 samples per class and shard size 600 / (n * s) dividing 60: every shard holds one class.
    p = make_partition("shards", TRAIN_Y, TEST_Y, num_clients, seed, shards_per_client=s, shard_style="sorted_pool")
    shard = len(TRAIN_Y) // (num_clients * s)
    assert p.num_clients == num_clients and p.label_maps is None
    assert_disjoint_and_complete(p.train, len(TRAIN_Y))  # no shard shared, none dropped
    assert_disjoint_and_complete(p.test, len(TEST_Y))
    for train, test in zip(p.train, p.test):
        counts = np.bincount(TRAIN_Y[train], minlength=10)
        assert len(train) == s * shard and np.all(counts % shard == 0)  # exactly s whole shards
        assert len(classes_of(TRAIN_Y, train)) <= s
        assert classes_of(TRAIN_Y, train) == classes_of(TEST_Y, test)
    for c in range(10):  # each class's test samples split evenly among its holders
        counts = [np.sum(TEST_Y[t] == c) for t in p.test if np.any(TEST_Y[t] == c)]
        assert max(counts) - min(counts) <= 1


def test_sorted_pool_shards_of_uneven_size_and_fractions() -> None:
    p = make_partition("shards", TRAIN_Y, TEST_Y, 7, 0, shards_per_client=2, train_fraction=0.5,
                       shard_style="sorted_pool")
    assert_disjoint_and_complete(p.train, 300)
    sizes = [len(t) for t in p.train]
    assert sum(sizes) == 300 and max(sizes) - min(sizes) <= 2  # 14 shards of 21 or 22


def partition_digest(p: Partition) -> str:
    h = hashlib.sha256()
    for part in p.train + p.test:
        h.update(np.int64(len(part)).tobytes() + part.astype(np.int64).tobytes())
    return h.hexdigest()[:16]


_RANDOM_LABELS = np.random.default_rng(7)
RANDOM_TRAIN_Y, RANDOM_TEST_Y = _RANDOM_LABELS.integers(0, 10, 1000), _RANDOM_LABELS.integers(0, 10, 300)


# Digests of `partition: shards` as fedsim computed it before shard_style existed (commit dae5d9e).
@pytest.mark.parametrize("labels,num_clients,s,seed,train_fraction,test_fraction,digest", [
    ("equal", 10, 3, 0, 1.0, 1.0, "1de844cea4b75a3a"),
    ("equal", 7, 2, 1, 0.5, 1.0, "3753f7c6385db002"),
    ("equal", 4, 15, 3, 1.0, 0.5, "5ac0d8e6b7493411"),
    ("random", 13, 2, 5, 1.0, 1.0, "d8086a636637ee0b"),  # shards straddle classes
    ("random", 20, 3, 2, 0.3, 0.4, "7b63179edd2f2362"),
])
def test_sorted_pool_reproduces_the_earlier_shards_bit_for_bit(labels: str, num_clients: int, s: int, seed: int,
                                                               train_fraction: float, test_fraction: float,
                                                               digest: str) -> None:
    train_y, test_y = (TRAIN_Y, TEST_Y) if labels == "equal" else (RANDOM_TRAIN_Y, RANDOM_TEST_Y)
    p = make_partition("shards", train_y, test_y, num_clients, seed, shards_per_client=s, shard_style="sorted_pool",
                       train_fraction=train_fraction, test_fraction=test_fraction)
    assert partition_digest(p) == digest


@pytest.mark.skipif(not os.environ.get("FEDSIM_DATA"), reason="set FEDSIM_DATA to the shared datasets folder")
def test_shards_on_real_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.environ.get("FEDSIM_CACHE"):
        monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path))
    d = load_dataset("cifar10")
    # FedBABU's CIFAR-10 setting (100 clients, s=2): 500 train and 100 test images per client.
    p = make_partition("shards", d.train_y, d.test_y, 100, 0, shards_per_client=2)
    assert {len(t) for t in p.train} == {500} and {len(t) for t in p.test} == {100}
    stats = p.stats(d.train_y, d.test_y, 10)
    assert stats["classes_per_client"] == stats["test_classes_per_client"]
    # experiments/personalization.yaml's partition as fedsim made it before shard_style existed (commit dae5d9e)
    old = make_partition("shards", d.train_y, d.test_y, 20, 0, shards_per_client=2, shard_style="sorted_pool",
                         train_fraction=0.1, test_fraction=0.2)
    assert partition_digest(old) == "f4e4f840ff8a5fa3"


# --------------------------------------------------------------------------- dirichlet


def effective_classes(p: Partition) -> float:
    """Mean over clients of exp(entropy of the train label mix): 1 = one class, 10 = uniform."""
    out = []
    for t in p.train:
        q = np.bincount(TRAIN_Y[t], minlength=10) / len(t)
        out.append(np.exp(-np.sum(q[q > 0] * np.log(q[q > 0]))))
    return float(np.mean(out))


def test_dirichlet() -> None:
    p = make_partition("dirichlet", TRAIN_Y, TEST_Y, 12, 0, beta=0.5)
    assert_disjoint_and_complete(p.train, len(TRAIN_Y))
    assert_disjoint_and_complete(p.test, len(TEST_Y))
    sizes = np.array([len(t) for t in p.train])
    assert sizes.min() >= 2 and min(len(t) for t in p.test) >= 1
    assert sizes.max() >= 2 * sizes.min()  # unequal sizes
    for train, test in zip(p.train, p.test):
        assert classes_of(TEST_Y, test) <= classes_of(TRAIN_Y, train)  # tested on its own mix
    big = int(np.argmax(sizes))  # a large client's test mix follows its train mix
    train_mix = np.bincount(TRAIN_Y[p.train[big]], minlength=10) / sizes[big]
    test_mix = np.bincount(TEST_Y[p.test[big]], minlength=10) / len(p.test[big])
    assert np.abs(train_mix - test_mix).max() < 0.15
    assert_same(p, make_partition("dirichlet", TRAIN_Y, TEST_Y, 12, 0, beta=0.5))
    assert not np.array_equal(p.train[0], make_partition("dirichlet", TRAIN_Y, TEST_Y, 12, 1, beta=0.5).train[0])


def test_dirichlet_smaller_beta_fewer_classes() -> None:
    skewed, even = (np.mean([effective_classes(make_partition("dirichlet", TRAIN_Y, TEST_Y, 10, seed, beta=beta))
                             for seed in range(3)]) for beta in (0.1, 10.0))
    assert skewed < 4 < 8 < even


# --------------------------------------------------------------------------- conflicting


def test_conflicting(tmp_path: Path) -> None:
    p = make_partition("conflicting", TRAIN_Y, TEST_Y, 5, 0)
    assert p.label_maps is not None and len(p.label_maps) == 5
    for train, test in zip(p.train, p.test):
        assert len(train) == 120 and len(test) == 40
        assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)  # no repeats within a client
    together = np.concatenate(p.train)
    assert len(np.unique(together)) < len(together)  # the same sample at several clients
    for m in p.label_maps:
        assert m.dtype == np.int64 and sorted(m.tolist()) == list(range(10))
    assert len({m.tobytes() for m in p.label_maps}) > 1  # the clients disagree about labels
    idx = p.train[3]
    assert np.array_equal(p.labels(3, TRAIN_Y, idx), p.label_maps[3][TRAIN_Y[idx]])
    stats = p.stats(TRAIN_Y, TEST_Y, 10)
    json.dumps(stats)
    assert stats["relabelled"] is True
    p.save(tmp_path / "p.npz")
    assert_same(p, Partition.load(tmp_path / "p.npz"))
    assert_same(p, make_partition("conflicting", TRAIN_Y, TEST_Y, 5, 0))


def test_labels_and_stats_apply_the_maps() -> None:
    y = np.array([0, 1, 1])
    plain = Partition((np.array([0, 1]),), (np.array([2]),))
    mapped = Partition(plain.train, plain.test, (np.array([2, 0, 1]),))
    assert np.array_equal(plain.labels(0, y, np.array([0, 1])), [0, 1])
    assert np.array_equal(mapped.labels(0, y, np.array([0, 1])), [2, 0])
    stats = mapped.stats(y, y, 3)
    assert stats["classes_per_client"] == [[0, 2]] and stats["test_classes_per_client"] == [[0]]
    assert plain.stats(y, y, 3)["relabelled"] is False


def test_load_rejects_a_partial_label_map_set(tmp_path: Path) -> None:
    np.savez(tmp_path / "p.npz", train_0=np.arange(2), test_0=np.arange(1), train_1=np.arange(2),
             test_1=np.arange(1), label_map_0=np.arange(3))
    with pytest.raises(DataError, match="p.npz"):
        Partition.load(tmp_path / "p.npz")


# --------------------------------------------------------------------------- natural


def test_natural_one_client_per_group() -> None:
    train_g = np.array([7, 7, 3, 3, 3, 9, 1, 1, 1])  # train counts: 3->3, 1->3, 7->2, 9->1
    test_g = np.array([9, 3, 1, 7, 7])
    train_y, test_y = np.zeros(9, np.int64), np.zeros(5, np.int64)
    p = make_partition("natural", train_y, test_y, 4, 0, groups=(train_g, test_g))
    assert [train_g[t].tolist() for t in p.train] == [[1, 1, 1], [3, 3, 3], [7, 7], [9]]  # ordered by id
    assert [test_g[t].tolist() for t in p.test] == [[1], [3], [7, 7], [9]]
    q = make_partition("natural", train_y, test_y, 2, 0, groups=(train_g, test_g))  # most data, ties by id
    assert [train_g[t][0] for t in q.train] == [1, 3]
    r = make_partition("natural", train_y, test_y, 4, 0, groups=(train_g, test_g), train_fraction=0.1)
    assert [len(t) for t in r.train] == [1, 1, 1, 1]  # the fraction applies per client


@pytest.mark.skipif(not os.environ.get("FEDSIM_DATA"), reason="set FEDSIM_DATA to the shared datasets folder")
def test_natural_on_real_femnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.environ.get("FEDSIM_CACHE"):
        monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path))
    d = load_dataset("femnist")
    assert d.train_x.shape == (14697, 28, 28, 1) and d.test_x.shape == (1695, 28, 28, 1) and d.num_classes == 62
    assert d.train_groups is not None and d.test_groups is not None
    p = make_partition("natural", d.train_y, d.test_y, 110, 0, groups=(d.train_groups, d.test_groups))
    assert p.num_clients == 110
    assert_disjoint_and_complete(p.train, len(d.train_y))
    assert_disjoint_and_complete(p.test, len(d.test_y))
    for writer, (train, test) in enumerate(zip(p.train, p.test)):
        assert set(d.train_groups[train].tolist()) == set(d.test_groups[test].tolist()) == {writer}


# --------------------------------------------------------------------------- errors and purity


@pytest.mark.parametrize(
    "kind,num_clients,kwargs,field",
    [
        ("pathological", 5, {}, "data.partition"),
        ("shards", 5, {}, "data.partition.shards_per_client"),
        ("shards", 5, {"shards_per_client": 0}, "data.partition.shards_per_client"),
        ("shards", 100, {"shards_per_client": 7}, "data.partition.shards_per_client"),  # 70 shards of a 60-sample class
        ("shards", 100, {"shards_per_client": 7, "shard_style": "sorted_pool"}, "data.partition.shards_per_client"),  # > 600
        ("shards", 5, {"shards_per_client": 2, "shard_style": "label_sorted"}, "data.partition.style"),
        ("shards", 7, {"shards_per_client": 2}, "data.partition.shards_per_client"),  # 14 shards for 10 classes
        ("shards", 10, {"shards_per_client": 10, "train_fraction": 0.1}, "data.train_fraction"),  # 6 for 10 shards
        ("shards", 30, {"shards_per_client": 10}, "data.test_fraction"),  # 20 test samples for 30 shards
        ("shards", 5, {"shards_per_client": 2, "test_y": TEST_Y[TEST_Y < 9]}, "data.partition.style"),  # no 9s
        ("dirichlet", 5, {}, "data.partition.beta"),
        ("dirichlet", 5, {"beta": 0.0}, "data.partition.beta"),
        ("dirichlet", 150, {"beta": 1.0}, "data.partition.beta"),  # 150 clients x 2 > 200 test samples
        ("dirichlet", 400, {"beta": 1.0}, "data.num_clients"),  # more clients than test samples
        ("conflicting", 601, {}, "data.num_clients"),
        ("natural", 5, {}, "data.partition: natural needs a dataset with per-sample client ids, e.g. femnist"),
        ("natural", 11, {"groups": (TRAIN_Y, TEST_Y)}, "data.num_clients"),  # 10 groups
        ("natural", 5, {"groups": (TRAIN_Y[:5], TEST_Y)}, "data.partition"),
    ],
)
def test_errors_name_the_setting(monkeypatch: pytest.MonkeyPatch, kind: str, num_clients: int, kwargs: dict,
                                 field: str) -> None:
    monkeypatch.setattr(kinds, "_DIRICHLET_TRIES", 3)  # keep the hopeless case fast
    kwargs = dict(kwargs)
    test_y = kwargs.pop("test_y", TEST_Y)
    with pytest.raises(DataError, match=field.replace(".", r"\.")) as info:
        make_partition(kind, TRAIN_Y, test_y, num_clients, seed=0, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind,kwargs", [("shards", {"shards_per_client": 5}),
                                         ("shards", {"shards_per_client": 2, "shard_style": "sorted_pool"}),
                                         ("dirichlet", {"beta": 0.3}),
                                         ("conflicting", {}), ("natural", {"groups": (TRAIN_Y, TEST_Y)})])
def test_new_kinds_are_pure_functions_of_the_seed(kind: str, kwargs: dict) -> None:
    state = np.random.get_state()
    a = make_partition(kind, TRAIN_Y, TEST_Y, 6, 4, train_fraction=0.5, **kwargs)
    np.random.seed(123)
    assert_same(a, make_partition(kind, TRAIN_Y, TEST_Y, 6, 4, train_fraction=0.5, **kwargs))
    np.random.set_state(state)
    b = make_partition(kind, TRAIN_Y, TEST_Y, 6, 5, train_fraction=0.5, **kwargs)
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, b.train))
    for t in a.train + a.test:
        assert t.dtype == np.int64 and np.all(np.diff(t) > 0)


def test_conflicting_maps_form_a_latin_square():
    """With as many clients as classes, each true class gets every label once: no global model beats chance."""
    y = np.repeat(np.arange(10), 30)
    part = make_partition("conflicting", y, y, 10, 4)
    maps = np.stack(part.label_maps)
    for true_class in range(10):
        assert sorted(maps[:, true_class]) == list(range(10))
    assert all(sorted(m) == list(range(10)) for m in maps)  # each map is a permutation
