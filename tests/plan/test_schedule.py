"""The run's schedule: client sampling and worker ownership, pure functions of the seed and the config."""
from fedsim.plan import balanced_owners, sample_clients


def test_sampling_is_seeded_and_sized():
    s = sample_clients(3, 5, 100, 0.1)
    assert s == sample_clients(3, 5, 100, 0.1) and len(s) == 10 and len(set(s)) == 10
    assert s != sample_clients(3, 6, 100, 0.1)
    assert sample_clients(0, 1, 10, 0.01) and len(sample_clients(0, 1, 10, 1.0)) == 10


def test_ownership_balances_cost_and_is_a_pure_function():
    costs = [10, 10, 5, 5, 3, 3, 2, 2]  # 40 in all: LPT splits it 20 / 20
    owners = balanced_owners(costs, 2)
    loads = [sum(c for c, w in zip(costs, owners) if w == k) for k in (0, 1)]
    assert loads == [20, 20] and owners == balanced_owners(costs, 2)
    equal = balanced_owners([1] * 30, 3)  # equal costs: round-robin by client id, every worker used
    assert equal == [c % 3 for c in range(30)]
    # The quickstart's k=4 partition (batches per epoch): client % 2 gives 49 vs 56 per worker.
    quickstart = [10, 10, 11, 12, 11, 8, 8, 10, 9, 16]
    loads = [sum(c for c, w in zip(quickstart, balanced_owners(quickstart, 2)) if w == k) for k in (0, 1)]
    assert loads == [54, 51]
