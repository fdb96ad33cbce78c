"""fedsim/privacy/noise.py: Gaussian draws of the right mean and std, each stream its own and a pure function of
its key (the seed, the stream, the round, the tensor or client)."""
import numpy as np
import pytest

from fedsim.privacy.noise import central_noise, count_noise, local_noise

DRAWS = 20_000


@pytest.mark.parametrize("draw", [lambda std: central_noise(3, 1, 0, DRAWS, std),
                                  lambda std: local_noise(3, 1, 5, DRAWS, std),
                                  lambda std: np.array([count_noise(3, r, std) for r in range(DRAWS)])],
                         ids=["central", "local", "count"])
@pytest.mark.parametrize("std", [0.05, 1.0, 7.5])
def test_noise_has_mean_zero_and_the_asked_std_within_four_standard_errors(draw, std):
    x = draw(std)
    assert x.dtype == np.float64 and x.size == DRAWS
    assert abs(x.mean()) < 4 * std / np.sqrt(DRAWS)
    assert abs(x.std(ddof=1) - std) < 4 * std / np.sqrt(2 * (DRAWS - 1))


def test_each_key_gives_its_own_stream_and_the_same_key_the_same_draws():
    base = central_noise(3, 1, 0, 50, 1.0)
    assert np.array_equal(base, central_noise(3, 1, 0, 50, 1.0))
    others = [central_noise(4, 1, 0, 50, 1.0), central_noise(3, 2, 0, 50, 1.0), central_noise(3, 1, 1, 50, 1.0),
              local_noise(3, 1, 0, 50, 1.0)]
    assert not any(np.allclose(base, other) for other in others)
    assert np.array_equal(central_noise(3, 1, 0, 50, 2.0), 2 * base)  # the std scales one standard normal stream
    assert np.array_equal(central_noise(3, 1, 0, 20, 1.0), base[:20])  # a prefix: the draws do not depend on size
