"""The ``privacy`` section: differential privacy of what leaves a client (user-level: one client's whole
contribution to a round is the unit protected) and secure aggregation of the uploads. Absent, a run is as it
always was. What each setting guarantees, to whom, and what the simulator does not model: docs/privacy.md."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedsim.config.base import Section

# The noise multipliers the accountant computes in bounded time and memory: below 0.1 a PLD's support explodes
# (measured: z = 0.01 took 87 s and 1.4 GB for 3 rounds, z = 1e-6 asked for 3.55 PiB) and epsilon is in the hundreds
# per round anyway; above 2^20 (noise a million times the clip norm) a run learns nothing. 0 means no noise.
SMALLEST_MULTIPLIER, LARGEST_MULTIPLIER = 0.1, 2.0 ** 20
# The most rounds whose epsilon after each round an accountant computes in bounded time (measured on a shared 2-core
# machine: rdp's series of 10,000 rounds 3.9 s, calibrating z for them 6.6 s poisson and 16.6 s fixed; pld's series
# grows with the square of the rounds, 500 rounds 29 s at q = 0.5 and 39 s at q = 1, 1,000 rounds 98 s at q = 0.5).
MAX_ACCOUNTED_ROUNDS = {"rdp": 10_000, "pld": 500}
# The rule for delta when privacy.delta is null, in the words every report prints beside the value.
DEFAULT_DELTA_RULE = "min(1e-5, 1/N²)"


def default_delta(population: int) -> float:
    """delta = min(1e-5, 1 / N^2) for N clients that may train: N x delta, the chance that some client's data is
    not protected, stays at most 1/N (and at most N x 1e-5), far below the 1/N at which "protect everyone but a few
    clients" would pass for a guarantee. (1 / N^1.1, the rule before, left N x delta = 0.54 at N = 500.)"""
    return min(1e-5, float(population) ** -2)


class AdaptiveClipping(Section):
    """Andrew et al. (NeurIPS 2021): the clip norm follows a quantile of the clients' update norms, steered each
    round by a noisy count of the clients whose update was within it (that count is accounted too)."""
    target_quantile: float = Field(0.5, gt=0, lt=1, description="gamma: the share of clients' update norms the "
                                   "clip norm tracks")
    lr: float = Field(0.2, gt=0, le=10, description="eta_C: the clip norm's geometric step each round (at most "
                      "10: the norm moves by at most exp(lr) a round)")
    count_noise: float | None = Field(None, ge=0, le=1e6, description="sigma_b: std of the noise on the count of clients "
                                      "within the clip norm, above noise_multiplier / 2 (the rest of the noise is the "
                                      "update's); null: the clients a round / 20 (Andrew et al.'s choice)")


class PrivacyConfig(Section):
    """User-level DP on the shared part's update (personal parts never leave a client) and secure aggregation."""
    dp: Literal["central", "local", "none"] = Field(
        "central", description="central: each client's update clipped, the server adds Gaussian noise once to the "
        "round's sum (DP-FedAvg, McMahan et al. 2018); local: each client clips and noises its own update (Flower's "
        "LocalDpMod); none: no DP (secure aggregation alone)")
    noise_multiplier: float | None = Field(None, ge=0, le=LARGEST_MULTIPLIER, description="z: noise std / clip "
                                           "norm, 0 (no noise) or 0.1 to 2^20; null: calibrated from target_epsilon "
                                           "before the run")
    clip_norm: float = Field(1.0, gt=0, le=1e6, description="C: the L2 bound of one client's update of the shared "
                             "part, over all its tensors (the initial bound under adaptive clipping)")
    adaptive: AdaptiveClipping | None = Field(None, description="adaptive clipping to a quantile of the update norms")
    delta: float | None = Field(None, gt=0, lt=1, description="the guarantee's delta, below 1/N; null: min(1e-5, 1/N^2) for the N clients that may train")
    target_epsilon: float | None = Field(None, gt=0, description="the budget: with noise_multiplier null the "
                                         "multiplier is calibrated to spend it over train.rounds; a run that would "
                                         "pass it refuses to start")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="Google's dp-accounting: Renyi DP or privacy loss "
                                              "distributions (tighter, slower)")
    secure_aggregation: bool = Field(False, description="pairwise masks on the clients' fixed-point uploads that "
                                     "cancel exactly in the sum (Bonawitz et al. 2017): same results, the server "
                                     "never sees one client's upload")

    @model_validator(mode="after")
    def _noise_from_one_source(self) -> PrivacyConfig:
        z = self.noise_multiplier
        if z is not None and 0 < z < SMALLEST_MULTIPLIER:
            raise ValueError(f"privacy.noise_multiplier: {z:g} is below {SMALLEST_MULTIPLIER:g}, where the accountant "
                             "cannot state epsilon in bounded time (and it would be in the hundreds a round); use 0 for "
                             f"no noise or at least {SMALLEST_MULTIPLIER:g}")
        if self.dp == "none":
            for name in ("noise_multiplier", "target_epsilon", "adaptive"):
                if getattr(self, name) is not None:
                    raise ValueError(f"privacy.{name}: set with privacy.dp: none; leave it out, or set privacy.dp: "
                                     "central or local")
        elif self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy: give privacy.noise_multiplier (e.g. 1.0) or privacy.target_epsilon (e.g. 8) "
                             "to say how much noise; or set privacy.dp: none for secure aggregation alone")
        return self
