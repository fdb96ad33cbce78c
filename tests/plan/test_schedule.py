"""The run's schedule: client sampling and worker ownership, pure functions of the seed and the config."""
import numpy as np

from fedsim.plan import balanced_owners, poisson_clients, sample_clients


def test_sampling_is_seeded_and_sized():
    s = sample_clients(3, 5, 100, 0.1)
    assert s == sample_clients(3, 5, 100, 0.1) and len(s) == 10 and len(set(s)) == 10
    assert s != sample_clients(3, 6, 100, 0.1)
    assert sample_clients(0, 1, 10, 0.01) and len(sample_clients(0, 1, 10, 1.0)) == 10


def test_poisson_sampling_is_seeded_independent_per_client_and_right_on_average():
    first = poisson_clients(3, 5, 100, 0.1)
    assert first == poisson_clients(3, 5, 100, 0.1) and first != poisson_clients(3, 6, 100, 0.1)
    assert first != poisson_clients(4, 5, 100, 0.1)
    sizes = np.array([len(poisson_clients(3, r, 100, 0.1)) for r in range(1, 2001)])
    # Binomial(100, 0.1) per round: mean 10, std 3; the mean of 2,000 rounds within 5 of its std error (0.067).
    assert abs(sizes.mean() - 10) < 5 * 3 / np.sqrt(2000) and 2.7 < sizes.std() < 3.3  # not a fixed size
    counts = np.bincount(np.concatenate([np.array(poisson_clients(3, r, 20, 0.3), int) for r in range(1, 2001)]), minlength=20)
    assert np.all(np.abs(counts / 2000 - 0.3) < 5 * np.sqrt(0.3 * 0.7 / 2000))  # every client at rate q


def test_poisson_sampling_draws_only_from_the_pool_and_can_draw_no_one():
    pool = np.array([1, 4, 7, 9])
    drawn = [c for r in range(1, 200) for c in poisson_clients(0, r, 10, 0.5, pool)]
    assert set(drawn) == {1, 4, 7, 9}
    assert any(not poisson_clients(0, r, 10, 0.05) for r in range(1, 50))


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
