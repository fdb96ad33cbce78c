"""User-level DP on the shared part's update: what a run's mechanism is (``UserLevelDP``, derived once by the plan)
and the server's side of each round (``ServerPrivacy``).

What is protected: one client's whole contribution to a round, the update of the shared layout (its WEIGHTS upload
minus the broadcast weights it started from), clipped to L2 norm C over all shared tensors jointly on the worker
(``fedsim.client.privatize``). Personal parts never leave a client and are neither clipped nor noised.

- central (DP-FedAvg, McMahan et al. 2018): the server adds N(0, (z_delta C)^2) once to each value of the round's sum
  of clipped updates and divides by the cohort: the count of kept clients under train.sampling fixed (public), the
  fixed q x N under poisson (McMahan et al.'s estimator, so the count is not revealed). Weights are uniform (checked
  with the config), so one client moves the sum by at most C (add/remove-one sensitivity C).
- local (as Flower's LocalDpMod): each client adds N(0, (z C)^2) to its own clipped update; the server adds none.
  The L2 sensitivity of one client's released update is 2C: replacing the client's data may move its clipped update
  anywhere in the ball of radius C, so two outputs differ by at most its diameter.
- adaptive clipping (Andrew et al. 2021, central only): C is server state, steered each round by the noisy centred
  count of clients whose update norm was within it (``clipping.released_count``: add/remove sensitivity 1/2); the
  configured z is the total, split by ``clipping.update_noise_multiplier``.

The per-client norms the server reads (``ClientReport.update_norm``) are a simulator diagnostic it only counts (the
clipped fraction, the mean norm, and adaptive clipping's count, which is noised before use); a deployment would
compute that count under secure aggregation."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.config.privacy import AdaptiveClipping, PrivacyConfig
from fedsim.privacy.clipping import (COUNT_NOISE_PER_CLIENT, next_clip_norm, released_count, share_within,
                                     update_noise_multiplier)
from fedsim.privacy.noise import central_noise, count_noise

CLIP_NORM = "privacy_clip_norm"  # checkpointed server state under adaptive clipping: the clip norm of the next round


@dataclass(frozen=True)
class UserLevelDP:
    """A run's DP mechanism, derived once (``RunPlan.privacy``'s, by :func:`user_level_dp`)."""
    central: bool  # the server's noise on the sum; else each client's own (local)
    noise_multiplier: float  # z: what the accountant composes
    update_multiplier: float  # z_delta: the update's own, z less what adaptive clipping's count takes of it
    clip_norm: float  # C, the initial one under adaptive clipping
    seed: int
    cohort: float  # the clients a round: q x N under poisson sampling, else round(f x N)
    poisson: bool  # the mean's denominator: the fixed ``cohort`` (poisson), else the count of kept clients
    adaptive: AdaptiveClipping | None = None
    count_std: float = 0.0  # sigma_b: the noise std of the count of clients within the clip norm (adaptive)

    def local_std(self, clip_norm: float) -> float:
        """Each client's own noise std on its update (0 under central DP)."""
        return 0.0 if self.central else self.noise_multiplier * clip_norm


@dataclass(frozen=True)
class PrivacyPlan:
    """A run's DP, derived once on the driver (:func:`fedsim.plan.privacy.derive_privacy`) and read by the server,
    the workers, the logger and ``--dry-run``; it holds no accountant, so the server's copy unpickles without
    dp-accounting."""
    mechanism: UserLevelDP  # z, the clip norm, each client's clipping and the server's noise
    spent: tuple[dict[str, float], ...]  # per round, the epsilon spent by its end (``fedsim.privacy.SPENT``'s keys)
    summary: dict[str, object]  # summary.json's ``privacy`` and --dry-run's line: final epsilon, delta, z, accountant


def user_level_dp(privacy: PrivacyConfig | None, noise_multiplier: float, seed: int, cohort: float,
                  poisson: bool) -> UserLevelDP | None:
    """The run's mechanism (None without DP); an adaptive split that leaves the update no noise is refused."""
    if privacy is None or privacy.dp == "none":
        return None
    adaptive = privacy.adaptive
    count_std = 0.0 if adaptive is None else (
        COUNT_NOISE_PER_CLIENT * cohort if adaptive.count_noise is None else adaptive.count_noise)
    update = noise_multiplier if adaptive is None else update_noise_multiplier(noise_multiplier, count_std)
    return UserLevelDP(privacy.dp == "central", noise_multiplier, update, privacy.clip_norm, seed, cohort, poisson,
                       adaptive, count_std)


class ServerPrivacy:
    """The server's side of the round: the clip norm it sends, the noise on the mean, what it records, and the clip
    norm as checkpointed state. Without DP (``dp`` None) every call leaves the round as it is."""

    def __init__(self, dp: UserLevelDP | None):
        self.dp = dp
        self.clip_norm = dp.clip_norm if dp else None

    def noisy_mean(self, round_idx: int, mean: np.ndarray, started_from: np.ndarray, offsets: tuple[int, ...],
                   tensors: list[int], kept: int) -> np.ndarray:
        """The mean of the kept clients' clipped uploads ``mean`` over the shared layout's tensors ``tensors``
        (``offsets``: the layout's tensor boundaries) as DP-FedAvg releases it: started_from + (sum of the updates +
        noise) / denominator."""
        dp = self.dp
        if dp is None or not dp.central:
            return mean
        assert self.clip_norm is not None
        std = dp.update_multiplier * self.clip_norm
        noise = np.concatenate([central_noise(dp.seed, round_idx, t, offsets[t + 1] - offsets[t], std)
                                for t in tensors])
        if not dp.poisson:
            return mean + noise / kept
        return started_from + (kept * (mean - started_from) + noise) / dp.cohort

    @property
    def releases_empty_rounds(self) -> bool:
        """Central DP under Poisson sampling releases a noisy model even in a round that kept nobody."""
        return self.dp is not None and self.dp.central and self.dp.poisson

    def after_round(self, round_idx: int, norms: list[float]) -> dict[str, float]:
        """What the round's mechanism did (rounds.jsonl's and W&B's ``privacy``), then adaptive clipping's step."""
        dp = self.dp
        if dp is None or not norms:
            return {}
        assert self.clip_norm is not None
        clip = self.clip_norm
        within = sum(norm <= clip for norm in norms)
        record = {"clip_norm": clip, "clipped_fraction": 1 - within / len(norms),
                  "update_norm_mean": float(np.mean(norms)),
                  "noise_std": dp.update_multiplier * clip if dp.central else dp.local_std(clip)}
        if dp.adaptive is not None:
            cohort = dp.cohort if dp.poisson else len(norms)
            share = share_within(self.released_count(round_idx, norms), cohort)
            self.clip_norm = next_clip_norm(clip, share, dp.adaptive.target_quantile, dp.adaptive.lr)
        return record

    def released_count(self, round_idx: int, norms: list[float]) -> float:
        """Adaptive clipping's release of the round: the centred count of the clients within this round's clip
        norm, noised (``clipping.released_count``)."""
        assert self.dp is not None and self.clip_norm is not None
        within = sum(norm <= self.clip_norm for norm in norms)
        return released_count(within, len(norms), count_noise(self.dp.seed, round_idx, self.dp.count_std))

    def checkpointed(self) -> dict[str, np.ndarray]:
        """The adaptive clip norm as an entry of the checkpoint's server state (none for a fixed one)."""
        if self.dp is None or self.dp.adaptive is None:
            return {}
        return {CLIP_NORM: np.array([self.clip_norm], np.float64)}

    def restore(self, server_state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take the clip norm out of a checkpoint's server state (absent: the initial one); returns the rest."""
        if self.dp is not None:
            self.clip_norm = float(server_state[CLIP_NORM][0]) if CLIP_NORM in server_state else self.dp.clip_norm
        return {name: v for name, v in server_state.items() if name != CLIP_NORM}
