"""fedsim/privacy/mechanism.py: the run's DP mechanism and the server's side of a round (the noise on the mean, its
denominator, what it records, the adaptive clip norm as checkpointed state)."""
import numpy as np
import pytest

from fedsim.config.privacy import AdaptiveClipping, PrivacyConfig
from fedsim.errors import ConfigError
from fedsim.privacy.mechanism import CLIP_NORM, ServerPrivacy, user_level_dp
from fedsim.privacy.noise import central_noise

OFFSETS = (0, 3, 8, 10)  # three tensors of the shared layout
ALL = [0, 1, 2]


def mechanism(poisson=False, cohort=4.0, **privacy):
    config = PrivacyConfig.model_validate({"noise_multiplier": 1.0, "clip_norm": 0.5, **privacy})
    return user_level_dp(config, config.noise_multiplier or 0.0, 11, cohort, poisson)


def test_without_dp_the_round_is_left_as_it_is():
    server = ServerPrivacy(user_level_dp(None, 0.0, 11, 4, False))
    mean = np.ones(10)
    assert server.clip_norm is None and server.noisy_mean(1, mean, mean, OFFSETS, ALL, 3) is mean
    assert server.after_round(1, []) == {} and server.checkpointed() == {}
    assert server.restore({"m": mean}) == {"m": mean}
    assert user_level_dp(PrivacyConfig(dp="none"), 0.0, 11, 4, False) is None


def test_central_noise_is_added_once_to_the_sum_per_tensor_whatever_the_grouping():
    server = ServerPrivacy(mechanism())
    mean, started_from = np.linspace(-1, 1, 10), np.zeros(10)
    whole = server.noisy_mean(1, mean, started_from, OFFSETS, ALL, 4)
    noise = np.concatenate([central_noise(11, 1, t, b - a, 0.5) for t, (a, b) in enumerate(zip(OFFSETS, OFFSETS[1:]))])
    assert np.array_equal(whole, mean + noise / 4)  # fixed sampling: the sum's noise over the count of kept clients
    by_tensor = np.concatenate([server.noisy_mean(1, mean[a:b], started_from[a:b], OFFSETS, [t], 4)
                                for t, (a, b) in enumerate(zip(OFFSETS, OFFSETS[1:]))])
    assert np.array_equal(by_tensor, whole)
    assert not np.array_equal(server.noisy_mean(2, mean, started_from, OFFSETS, ALL, 4), whole)  # fresh each round


def test_poisson_sampling_divides_by_the_expected_cohort_so_the_count_is_not_revealed():
    server = ServerPrivacy(mechanism(poisson=True, cohort=8.0, noise_multiplier=0.0))
    started_from, mean = np.full(10, 2.0), np.full(10, 3.0)  # 4 kept clients, each moved every value by 1
    assert np.allclose(server.noisy_mean(1, mean, started_from, OFFSETS, ALL, 4), 2.0 + 4 * 1.0 / 8)


def test_local_dp_leaves_the_mean_to_the_clients_noise():
    server = ServerPrivacy(mechanism(dp="local"))
    mean = np.ones(10)
    assert server.noisy_mean(1, mean, mean, OFFSETS, ALL, 3) is mean
    assert server.after_round(1, [0.2, 1.0])["noise_std"] == 1.0 * 0.5  # each client's own: z C


def test_the_round_records_its_clipping_and_noise():
    record = ServerPrivacy(mechanism()).after_round(1, [0.2, 0.5, 0.9, 1.4])
    assert record == {"clip_norm": 0.5, "clipped_fraction": 0.5, "update_norm_mean": 0.75, "noise_std": 0.5}


def test_the_adaptive_clip_norm_moves_is_checkpointed_and_restored():
    dp = mechanism(cohort=40.0, adaptive={"target_quantile": 0.5, "lr": 0.2})
    assert dp.count_std == 40.0 / 20 and dp.update_multiplier > dp.noise_multiplier
    server = ServerPrivacy(dp)
    record = server.after_round(1, [2.0, 3.0, 4.0, 5.0])  # (noisily) nobody within 0.5: the norm grows
    assert record["noise_std"] == dp.update_multiplier * 0.5 and server.clip_norm > 0.5
    saved = server.checkpointed()
    assert set(saved) == {CLIP_NORM}
    other = ServerPrivacy(dp)
    assert other.restore({**saved, "momentum": np.zeros(2)}).keys() == {"momentum"}
    assert other.clip_norm == server.clip_norm
    other.restore({})  # a rollback to round 0
    assert other.clip_norm == 0.5


def test_an_adaptive_split_without_room_for_the_update_is_refused_when_the_mechanism_is_built():
    with pytest.raises(ConfigError, match=r"^privacy.adaptive.count_noise: sigma_b 0.2 \(null: the clients a round "
                                          r"/ 20\) leaves no noise"):
        mechanism(adaptive=AdaptiveClipping(count_noise=None).model_dump())  # 4 clients / 20 = 0.2 <= 1 / 2
