"""fedsim/privacy/clipping.py: adaptive clipping's step (Andrew et al. 2021) and the split of the noise multiplier
between the update and the count that steers the clip norm."""
import math

import numpy as np
import pytest

from fedsim.errors import ConfigError
from fedsim.privacy.clipping import next_clip_norm, released_count, share_within, update_noise_multiplier
from fedsim.privacy.noise import count_noise


@pytest.mark.parametrize("quantile", [0.2, 0.5, 0.9])
def test_adaptive_clipping_converges_to_its_target_quantile_on_a_stream_of_norms(quantile):
    """Norms drawn afresh each round (lognormal, 100 clients), the count noised as a run noises it (sigma_b = m / 20):
    the clip norm settles where the share of norms within it is the target quantile."""
    rng = np.random.default_rng(7)
    clip, clients, settled = 0.01, 100, []
    for round_idx in range(1, 601):
        norms = rng.lognormal(mean=0.0, sigma=1.0, size=clients)
        released = released_count(int(np.sum(norms <= clip)), clients, count_noise(7, round_idx, clients / 20))
        clip = next_clip_norm(clip, share_within(released, clients), quantile, lr=0.2)
        if round_idx > 300:
            settled.append(clip)
    true_quantile = math.exp(1.0 * float(np.quantile(rng.standard_normal(10**6), quantile)))  # of lognormal(0, 1)
    assert abs(np.mean(settled) / true_quantile - 1) < 0.1
    share = np.mean(rng.lognormal(0.0, 1.0, 10**6) <= np.mean(settled))
    assert abs(share - quantile) < 0.04


def test_the_clip_norm_grows_below_its_quantile_shrinks_above_and_stays_at_it():
    assert next_clip_norm(1.0, 0.2, 0.5, 0.2) > 1.0  # 20% within, 50% wanted: grow
    assert next_clip_norm(1.0, 0.8, 0.5, 0.2) < 1.0
    assert next_clip_norm(1.0, 0.5, 0.5, 0.2) == 1.0
    assert next_clip_norm(2.0, 1.0, 0.5, 0.2) == pytest.approx(2.0 * math.exp(-0.1))


def test_the_released_count_is_centred_so_one_client_moves_it_by_a_half():
    """Andrew et al.'s count: sum_i (b_i - 1/2). Adding a client within C or one outside moves it by +-1/2 (the raw
    count would move by 1 for the first); the share read back over the cohort is the raw share when nothing is
    noised."""
    base = released_count(3, 7, 0.0)
    assert released_count(4, 8, 0.0) - base == 0.5 and released_count(3, 8, 0.0) - base == -0.5
    assert released_count(4, 7, 0.0) - base == 1.0  # replace one client outside C by one within: 1
    assert share_within(base, 7) == pytest.approx(3 / 7)
    assert released_count(3, 7, 0.25) == base + 0.25


@pytest.mark.parametrize("z, sigma_b", [(1.0, 5.0), (0.5, 0.3), (3.0, 1.6)])
def test_the_update_and_the_count_compose_to_the_configured_noise_multiplier(z, sigma_b):
    update = update_noise_multiplier(z, sigma_b)
    assert update > z  # the update takes more noise than the total: the count spent some of the budget
    assert (update ** -2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(z, rel=1e-12)


def test_a_count_noise_that_leaves_the_update_none_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^privacy.adaptive.count_noise: sigma_b 0.5 .* no noise .* above 0.5$"):
        update_noise_multiplier(1.0, 0.5)
    assert update_noise_multiplier(0.0, 0.0) == 0.0  # no noise at all: nothing to split


def test_the_noisy_share_is_clipped_to_zero_one_so_a_huge_count_noise_moves_the_norm_by_at_most_exp_lr():
    assert share_within(released_count(3, 7, 1e9), 7) == 1.0 and share_within(released_count(3, 7, -1e9), 7) == 0.0
    assert next_clip_norm(1.0, share_within(released_count(3, 7, -1e9), 7), 0.5, 0.2) == pytest.approx(math.exp(0.1))
