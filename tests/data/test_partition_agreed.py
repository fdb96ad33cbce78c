"""data.partition: {name: conflicting, agreed: a}: the first round(a x C) classes keep their label at every client,
the rest are permuted per client (a Latin square over them); a = 0 is the earlier partition bit for bit, with the
fingerprint it had."""
from __future__ import annotations

import numpy as np
import pytest

from fedsim.config import changed_settings, resume_fingerprint, validate
from fedsim.data import DataError, make_partition
from fedsim.data.partitioning.request import Request
from fedsim.errors import ConfigError

Y = np.repeat(np.arange(10), 30)  # 10 classes x 30


def conflicting_before_agreed(train_y, test_y, num_clients, seed, train_fraction=1.0, test_fraction=1.0):
    """The conflicting partition as fedsim drew it before data.partition.agreed (commit afdda62), verbatim."""
    r = Request(np.asarray(train_y, np.int64), np.asarray(test_y, np.int64), num_clients, np.random.default_rng(seed),
                train_fraction, test_fraction, None, None, "fedbabu", None, None)
    train, test = ([np.sort(r.rng.choice(pool, len(pool) // r.num_clients, replace=False))
                    for _ in range(r.num_clients)] for pool in r.pools())
    num_classes = int(max(r.train_y.max(initial=0), r.test_y.max(initial=0))) + 1
    base, shifts = r.rng.permutation(num_classes), r.rng.permutation(num_classes)
    classes = np.arange(num_classes)
    maps = tuple(base[(classes + shifts[j % num_classes]) % num_classes] for j in range(r.num_clients))
    return train, test, maps


@pytest.mark.parametrize("clients,seed,fraction", [(4, 7, 1.0), (10, 0, 1.0), (13, 3, 0.5), (1, 9, 1.0)])
def test_agreed_0_is_the_earlier_partition_bit_for_bit(clients, seed, fraction):
    train, test, maps = conflicting_before_agreed(Y, Y, clients, seed, fraction, fraction)
    for kwargs in ({}, {"agreed": 0.0}):
        p = make_partition("conflicting", Y, Y, clients, seed, train_fraction=fraction, test_fraction=fraction,
                           **kwargs)
        assert all(np.array_equal(a, b) for a, b in zip(p.train, train)) and len(p.train) == len(train)
        assert all(np.array_equal(a, b) for a, b in zip(p.test, test))
        assert all(np.array_equal(a, b) and a.dtype == np.int64 for a, b in zip(p.label_maps, maps))


def test_agreed_0_label_maps_pinned():
    """The maps of one seed as the implementation before `agreed` gave them (a guard independent of the copy above)."""
    p = make_partition("conflicting", Y, Y, 4, 7)
    assert [m.tolist() for m in p.label_maps] == [[7, 3, 1, 4, 0, 2, 5, 6, 8, 9], [4, 0, 2, 5, 6, 8, 9, 7, 3, 1],
                                                  [1, 4, 0, 2, 5, 6, 8, 9, 7, 3], [8, 9, 7, 3, 1, 4, 0, 2, 5, 6]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agreed_half_keeps_half_the_classes_and_permutes_the_rest_differently_at_every_client(seed):
    p = make_partition("conflicting", Y, Y, 5, seed, agreed=0.5)
    maps = np.stack(p.label_maps)
    assert maps.dtype == np.int64 and maps.shape == (5, 10)
    assert (maps[:, :5] == np.arange(5)).all()  # the first round(0.5 x 10) = 5 classes: their true label everywhere
    permuted = maps[:, 5:]
    for row in permuted:
        assert sorted(row.tolist()) == [5, 6, 7, 8, 9]  # a permutation of the permuted classes among themselves
    for true_class in range(5):  # no two clients agree on any permuted class (5 clients, 5 permuted classes)
        assert len(set(permuted[:, true_class].tolist())) == 5
    assert (permuted != np.arange(5, 10)).sum() >= 5 * 5 - 5  # Latin square: each class kept by one client at most
    # the samples drawn are the agreed = 0 partition's: only the labels change
    plain = make_partition("conflicting", Y, Y, 5, seed)
    assert all(np.array_equal(a, b) for a, b in zip(p.train + p.test, plain.train + plain.test))
    assert make_partition("conflicting", Y, Y, 5, seed, agreed=0.5).label_maps[3].tolist() == maps[3].tolist()


def test_agreed_rounds_half_up_and_the_latin_square_repeats_past_the_permuted_classes():
    maps = np.stack(make_partition("conflicting", Y, Y, 8, 1, agreed=0.25).label_maps)  # 2.5 -> 3 agreed classes
    assert (maps[:, :3] == np.arange(3)).all() and not (maps[:, 3:] == np.arange(3, 10)).all()
    for true_class in range(3, 10):  # 7 permuted classes: any 7 consecutive clients give every label once
        assert sorted(maps[:7, true_class].tolist()) == list(range(3, 10))
    assert np.array_equal(maps[7], maps[0])  # client 7 repeats client 0, as the agreed = 0 square does


def test_labels_apply_the_partial_maps():
    p = make_partition("conflicting", Y, Y, 3, 5, agreed=0.5)
    idx = p.train[1]
    labels = p.labels(1, Y, idx)
    agreed = Y[idx] < 5
    assert np.array_equal(labels[agreed], Y[idx][agreed]) and (labels[~agreed] >= 5).all()
    assert p.stats(Y, Y, 10)["relabelled"] is True


@pytest.mark.parametrize("agreed", [0.9, 0.85, -0.1, 1.0])
def test_agreed_leaving_under_two_permuted_classes_or_out_of_range_is_a_data_error(agreed):
    with pytest.raises(DataError, match=r"data\.partition\.agreed") as info:
        make_partition("conflicting", Y, Y, 4, 0, agreed=agreed)
    assert "\n" not in str(info.value)


def test_other_kinds_ignore_agreed():
    a = make_partition("iid", Y, Y, 4, 0)
    b = make_partition("iid", Y, Y, 4, 0, agreed=0.5)
    assert b.label_maps is None and all(np.array_equal(x, y) for x, y in zip(a.train, b.train))


def _tree(partition) -> dict:
    return {"name": "t", "seed": 1, "algorithm": "fedper",
            "data": {"dataset": "cifar10", "num_clients": 4, "partition": partition}}


def test_config_reaches_make_partition_and_keeps_old_fingerprints():
    plain = validate(_tree("conflicting"))
    assert plain.data.partition.agreed == 0.0 and plain.data.partition.arguments() == {"agreed": 0.0}
    half = validate(_tree({"name": "conflicting", "agreed": 0.5}))
    assert half.data.partition.arguments() == {"agreed": 0.5}
    before = plain.model_dump()
    del before["data"]["partition"]["agreed"]  # a config written before data.partition.agreed existed
    assert resume_fingerprint(before) == resume_fingerprint(plain.model_dump())
    assert resume_fingerprint(half.model_dump()) != resume_fingerprint(plain.model_dump())
    assert changed_settings(plain.model_dump(), half.model_dump()) == ["data.partition.agreed"]
    explicit_zero = validate(_tree({"name": "conflicting", "agreed": 0}))
    assert resume_fingerprint(explicit_zero.model_dump()) == resume_fingerprint(plain.model_dump())


@pytest.mark.parametrize("agreed", [1, 1.5, -0.1, True, "half"])
def test_bad_agreed_is_a_one_line_config_error(agreed):
    with pytest.raises(ConfigError, match=r"data\.partition\.agreed") as info:
        validate(_tree({"name": "conflicting", "agreed": agreed}))
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"data\.partition\.agreed"):  # only the conflicting kind takes it
        validate(_tree({"name": "iid", "agreed": 0.5}))
