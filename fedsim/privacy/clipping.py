"""The clip norm of user-level DP: fixed, or adapted to a quantile of the clients' update norms (Andrew et al.,
NeurIPS 2021, "Differentially Private Learning with Adaptive Clipping"), and how the configured noise multiplier
is split between the update and the count that steers the clip norm.

Clipping itself (an update scaled by min(1, C / ||update||) over every tensor of the shared layout at once) runs on
the worker, on the device, in ``fedsim.client.privatize``."""
from __future__ import annotations

import math

from fedsim.errors import ConfigError

# Andrew et al.'s choice (and TFF's gaussian_adaptive default): the count's noise std is 1/20 of the clients a round.
COUNT_NOISE_PER_CLIENT = 0.05


def update_noise_multiplier(total: float, count_std: float) -> float:
    """z_delta, the noise multiplier of the update when the count of clients within the clip norm is noised with std
    ``count_std`` (sigma_b): Andrew et al.'s Theorem 1, a round releasing the update at z_delta and the count
    sum_i (b_i - 1/2) (add/remove sensitivity 1/2: :func:`released_count`) at sigma_b is the Gaussian mechanism at
    z = (z_delta^-2 + (2 sigma_b)^-2)^(-1/2), so z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2). The accountant composes
    the Gaussian mechanism at the configured z (``total``), adaptive or not."""
    if total == 0:
        return 0.0  # no noise at all: nothing to split
    if 2 * count_std <= total:
        raise ConfigError(f"privacy.adaptive.count_noise: sigma_b {count_std:g} (null: the clients a round / 20) "
                          f"leaves no noise for the update at "
                          f"noise_multiplier {total:g} (adaptive clipping needs count_noise > noise_multiplier / 2, "
                          f"Andrew et al.); raise privacy.adaptive.count_noise above {total / 2:g}")
    return (total ** -2 - (2 * count_std) ** -2) ** -0.5


def released_count(within: int, reported: int, noise: float) -> float:
    """What adaptive clipping releases of a round: sum_i (b_i - 1/2) + noise over the ``reported`` clients, ``within``
    of them with b_i = 1 (update norm at most C). Centred, as Andrew et al. and TF Privacy's
    ``QuantileEstimatorQuery`` release it: adding or removing one client moves it by 1/2 (the raw count moves by
    1), which is the sensitivity :func:`update_noise_multiplier`'s split assumes; replacing one client moves it by 1,
    the same as the raw count, so fixed-size sampling's accounting at z / 2 holds too."""
    return within - reported / 2 + noise


def share_within(released: float, cohort: float) -> float:
    """b_bar, the noisy share of clients within C: the released centred count over the cohort (the expected q x N
    under Poisson sampling, so the count of clients is not revealed; the kept clients under fixed-size), plus 1/2,
    clipped to [0, 1] as TF Privacy's quantile estimator clips it (post-processing: no privacy spent), so a large
    count noise moves the clip norm by at most exp(lr) a round."""
    return min(1.0, max(0.0, released / cohort + 0.5))


def next_clip_norm(clip_norm: float, share: float, target_quantile: float, lr: float) -> float:
    """Andrew et al.'s geometric step: C <- C exp(-eta_C (b_bar - gamma)), b_bar = ``share`` the (noisy) share of
    clients whose update norm was at most C. Below the target quantile the norm grows, above it shrinks; at the
    quantile it stays."""
    return clip_norm * math.exp(-lr * (share - target_quantile))
