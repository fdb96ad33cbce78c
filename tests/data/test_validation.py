"""data.validation's split: drawn from the seed per client, disjoint from what the client trains on, stratified per
class, the fraction respected, and a client that holds a class once handled by the stated rule."""
import numpy as np
import pytest

from fedsim.data import DataError, Partition
from fedsim.data.validation import hold_out, validation_splits


def _partition() -> tuple[Partition, np.ndarray]:
    """Three clients over 300 training samples of 4 classes: 0 holds 40 of each class, 1 holds 50 of class 0 and 25
    of class 1 and one sample each of classes 2 and 3, 2 holds the rest."""
    y = np.repeat(np.arange(4), 75)
    by_class = [np.flatnonzero(y == c) for c in range(4)]
    zero = np.concatenate([idx[:40] for idx in by_class])
    one = np.concatenate([by_class[0][40:], by_class[1][40:65], by_class[2][40:41], by_class[3][40:41]])
    two = np.setdiff1d(np.arange(300), np.concatenate([zero, one]))
    train = tuple(np.sort(t).astype(np.int64) for t in (zero, one, two))
    return Partition(train, tuple(np.arange(3, dtype=np.int64) + i for i in range(3))), y


def test_the_split_is_disjoint_from_training_covers_the_clients_data_and_follows_the_seed():
    partition, y = _partition()
    train, val = validation_splits(partition, y, 0.2, seed=5)
    for client in range(3):
        assert len(np.intersect1d(train[client], val[client])) == 0
        assert np.array_equal(np.union1d(train[client], val[client]), partition.train[client])
        assert np.all(np.diff(train[client]) > 0) and np.all(np.diff(val[client]) > 0)
    again = validation_splits(partition, y, 0.2, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(val, again[1]))
    other = validation_splits(partition, y, 0.2, seed=6)
    assert not all(np.array_equal(a, b) for a, b in zip(val, other[1]))


def test_each_class_gives_its_share_and_classes_held_once_are_pooled():
    partition, y = _partition()
    _, val = validation_splits(partition, y, 0.2, seed=5)
    assert np.bincount(y[val[0]], minlength=4).tolist() == [8, 8, 8, 8]  # 0.2 x 40 of every class
    # client 1: 0.2 x 35 = 7 of class 0, 0.2 x 25 = 5 of class 1; classes 2 and 3 once each: round(0.2 x 2) = 0
    assert np.bincount(y[val[1]], minlength=4).tolist() == [7, 5, 0, 0]
    _, larger = validation_splits(partition, y, 0.3, seed=5)
    held = np.bincount(y[larger[1]], minlength=4)
    assert held[:2].tolist() == [11, 8] and held[2:].sum() == 1  # round half up: 10.5 -> 11, 0.6 -> 1 of the pool


def test_a_client_that_would_hold_out_nothing_holds_out_one_and_one_sample_is_refused():
    rng = np.random.default_rng(0)
    assert len(hold_out(np.array([0, 1, 2]), 0.1, rng)) == 1  # every class held once, 0.1 x 3 rounds to 0
    assert len(hold_out(np.array([0, 0]), 0.9, rng)) == 1  # one sample of the class stays to train
    assert len(hold_out(np.array([0, 1]), 0.9, rng)) == 1  # the pool never takes the last training sample
    tiny = Partition((np.array([0, 1], np.int64), np.array([2], np.int64)), (np.array([0]), np.array([1])))
    with pytest.raises(DataError, match="data.validation: client 1 holds 1 training sample"):
        validation_splits(tiny, np.zeros(3, np.int64), 0.2, seed=0)


def test_without_validation_the_partition_is_untouched_and_a_client_draws_from_its_own_stream():
    partition, y = _partition()
    train, val = validation_splits(partition, y, 0.0, seed=5)
    assert train is partition.train and all(len(v) == 0 for v in val)
    _, val = validation_splits(partition, y, 0.2, seed=5)
    fewer = Partition(partition.train[:2], partition.test[:2])  # another client gone: the others' draws stay
    _, kept = validation_splits(fewer, y, 0.2, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(val, kept))


def test_stratification_reads_the_clients_own_labels():
    """A conflicting partition relabels per client: classes are counted as the client sees them."""
    y = np.repeat(np.arange(2), 10)
    swap = np.array([1, 0], np.int64)
    part = Partition((np.arange(20, dtype=np.int64)[:15],), (np.array([0]),), label_maps=(swap,))
    _, [val] = validation_splits(part, y, 0.2, seed=1)
    assert np.bincount(swap[y[val]], minlength=2).tolist() == [1, 2]  # 0.2 x 5 of its class 0, 0.2 x 10 of class 1
