"""fedsim/plan/population.py: who may train and how many a round, stated once: the samplers, the cohort DP and the
clock read, and the held-out clients' pool."""
import numpy as np

from fedsim.plan import Population, poisson_clients, sample_clients


def test_the_cohort_is_f_of_the_clients_that_may_train_and_at_least_one():
    everyone = Population(10, fraction=0.25)
    held_out = Population(10, frozenset({1, 4}), fraction=0.25)
    assert everyone.trainable == 10 and everyone.cohort == 2 and everyone.pool is None and everyone.mask.all()
    assert held_out.trainable == 8 and held_out.cohort == 2 and held_out.trainable_clients == [0, 2, 3, 5, 6, 7, 8, 9]
    assert list(held_out.pool) == held_out.trainable_clients and list(np.flatnonzero(held_out.mask)) == list(held_out.pool)
    assert Population(10, fraction=0.01).cohort == 1


def test_dp_reads_the_fixed_cohort_or_q_times_n_under_poisson_sampling():
    assert Population(10, frozenset({0, 1}), 0.3).expected_cohort == 2
    assert Population(10, frozenset({0, 1}), 0.3, poisson=True).expected_cohort == 0.3 * 8


def test_a_population_draws_what_its_sampler_draws_from_its_pool():
    fixed, poisson = Population(20, frozenset({3, 7}), 0.25), Population(20, frozenset({3, 7}), 0.25, poisson=True)
    for round_idx in range(1, 6):
        assert fixed.sampled(5, round_idx) == sample_clients(5, round_idx, 20, 0.25, fixed.pool)
        assert poisson.sampled(5, round_idx) == poisson_clients(5, round_idx, 20, 0.25, poisson.pool)
        assert not {3, 7} & (set(fixed.sampled(5, round_idx)) | set(poisson.sampled(5, round_idx)))
    assert Population(20, fraction=0.25).sampled(5, 1) == sample_clients(5, 1, 20, 0.25)
