"""Secure aggregation's pairwise masks (fedsim/privacy/secagg.py): they cancel in the sum mod 2^64 for the whole
cohort and, once the server removes the dropped clients' pairs, for any set of survivors; one masked upload alone
looks uniform."""
import numpy as np
import pytest

from fedsim.privacy.secagg import PairwiseMasks

SIZES = {"weights": 257, "extra": 5}  # two uploads: each gets its own part of a client's mask, laid out by name


def _uploads(rng: np.random.Generator, clients: list[int], sizes: dict[str, int]) -> dict[int, dict[str, np.ndarray]]:
    """int64 fixed-point vectors as workers make them: anywhere below 2^62 / |cohort| in magnitude, so sums fit."""
    bound = 2 ** 62 // max(len(clients), 1)
    return {c: {name: rng.integers(-bound, bound, size, dtype=np.int64) for name, size in sizes.items()}
            for c in clients}


def _masked_total(masks: PairwiseMasks, uploads: dict[int, dict[str, np.ndarray]], senders: list[int]) -> dict:
    """What the server adds up: each sender's upload plus its mask, mod 2^64 (numpy's int64 addition wraps)."""
    totals = {name: np.zeros(size, np.int64) for name, size in SIZES.items()}
    for client in senders:
        for name, words in masks.mask(client, SIZES).items():
            totals[name] += (uploads[client][name].view(np.uint64) + words).view(np.int64)
    return totals


def _true_total(uploads: dict[int, dict[str, np.ndarray]], senders: list[int]) -> dict:
    return {name: sum((uploads[c][name] for c in senders), np.zeros(size, np.int64)) for name, size in SIZES.items()}


def test_masks_cancel_exactly_over_the_whole_cohort():
    rng = np.random.default_rng(0)
    cohort = [1, 4, 5, 9, 17]
    masks = PairwiseMasks(seed=7, round=3, cohort=tuple(cohort))
    uploads = _uploads(rng, cohort, SIZES)
    totals = _masked_total(masks, uploads, cohort)
    masks.unmask(totals, cohort)  # nobody dropped: nothing to remove
    for name, expected in _true_total(uploads, cohort).items():
        np.testing.assert_array_equal(totals[name], expected)


def test_masks_cancel_for_any_dropout_set():
    # A property over random cohorts and random dropout sets: none, one, all but one, any subset.
    rng = np.random.default_rng(1)
    for trial in range(150):
        cohort = sorted(rng.choice(40, size=int(rng.integers(1, 9)), replace=False).tolist())
        survivors = sorted(c for c in cohort if rng.random() < rng.random())
        if trial % 10 == 0:
            survivors = cohort[:1]  # everyone else dropped
        if not survivors:
            continue  # the server aggregates nothing in a round where nobody delivers
        masks = PairwiseMasks(seed=int(rng.integers(2 ** 31)), round=trial + 1, cohort=tuple(cohort))
        uploads = _uploads(rng, cohort, SIZES)
        totals = _masked_total(masks, uploads, survivors)
        masks.unmask(totals, survivors)
        for name, expected in _true_total(uploads, survivors).items():
            np.testing.assert_array_equal(totals[name], expected, err_msg=f"cohort {cohort}, survivors {survivors}")


def test_without_recovery_a_dropout_leaves_the_sum_masked():
    # The recovery is what makes a round with a dropout come out right: leave it out and the sum is noise.
    rng = np.random.default_rng(2)
    cohort = [0, 1, 2, 3]
    masks = PairwiseMasks(seed=1, round=1, cohort=tuple(cohort))
    uploads = _uploads(rng, cohort, SIZES)
    totals = _masked_total(masks, uploads, [0, 1, 3])
    assert not np.array_equal(totals["weights"], _true_total(uploads, [0, 1, 3])["weights"])


def test_one_masked_upload_looks_uniform():
    rng = np.random.default_rng(3)
    masks = PairwiseMasks(seed=11, round=2, cohort=(0, 3, 8))
    upload = np.zeros(20_000, np.int64)  # the least random upload there is
    upload[::7] = rng.integers(-1000, 1000, upload[::7].size)
    masked = (upload.view(np.uint64) + masks.mask(3, {"weights": upload.size})["weights"]).view(np.int64)
    bits = (masked.view(np.uint64)[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.05)
    assert np.mean(masked == upload) < 1e-3


def test_masks_are_a_function_of_seed_round_and_pair_only():
    a = PairwiseMasks(seed=5, round=2, cohort=(1, 2, 6))
    same = PairwiseMasks(seed=5, round=2, cohort=(1, 2, 6))
    np.testing.assert_array_equal(a.mask(2, {"weights": 64})["weights"], same.mask(2, {"weights": 64})["weights"])
    np.testing.assert_array_equal(a.pair_mask(1, 6, 32), PairwiseMasks(5, 2, (0, 1, 6, 9)).pair_mask(1, 6, 32))
    for other in (PairwiseMasks(6, 2, (1, 2, 6)), PairwiseMasks(5, 3, (1, 2, 6))):
        assert not np.array_equal(a.pair_mask(1, 6, 32), other.pair_mask(1, 6, 32))
    # The uploads are laid out by name: a dict in another order gets the same words per upload.
    forward = a.mask(1, {"a": 3, "b": 4})
    backward = a.mask(1, {"b": 4, "a": 3})
    assert list(backward) == ["b", "a"] and all(np.array_equal(forward[n], backward[n]) for n in forward)


def test_clients_outside_the_cohort_are_refused():
    masks = PairwiseMasks(seed=1, round=1, cohort=(0, 2))
    with pytest.raises(ValueError, match="client 1 is not in round 1's cohort"):
        masks.mask(1, {"weights": 4})
    with pytest.raises(ValueError, match=r"survivors \[5\] are not in round 1's cohort"):
        masks.unmask({"weights": np.zeros(4, np.int64)}, [0, 5])
    with pytest.raises(ValueError, match="distinct clients in order"):
        PairwiseMasks(seed=1, round=1, cohort=(2, 0))
