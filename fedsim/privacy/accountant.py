"""The accountant: what a run's DP noise guarantees, by Google's dp-accounting, for the sampling the run really does.

Central DP (DP-FedAvg): one round is one sampled Gaussian mechanism on the round's sum of clipped updates, the
unit protected is one client (user-level), and the run is those rounds composed, empty rounds included (the analysis
takes the noised sum as released every round: an empty round's is its zero sum noised):

- ``train.sampling: poisson``: each client joins with probability q = train.fraction, independently:
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under add-or-remove-one neighbouring (a client's data present or
  absent), the relation dp-accounting's RDP and PLD accountants support for it.
- ``train.sampling: fixed``: K = max(1, round(q N)) of the N clients that may train, drawn without replacement:
  ``SampledWithoutReplacementDpEvent(N, K, GaussianDpEvent(z / 2))`` under replace-one neighbouring, the only relation
  dp-accounting accounts this sampling under (N is public). Replacing one client's clipped update by another moves
  the sum by up to 2C, twice the add-or-remove sensitivity, hence the multiplier's halving
  (:func:`replace_one_multiplier`). dp-accounting's PLD accountant has no event for it: fixed + pld is refused with
  the config (``fedsim.config.checks``).

Adaptive clipping (Andrew et al., NeurIPS 2021): z is the *total* noise multiplier of the combined query (the
noisy update and the noisy count of clients within the clip norm); the mechanism's code splits z between the two
(z_update^-2 + (2 sigma_b)^-2 = z^-2), so the composition is one Gaussian at z per round and the accountant needs
nothing more.

Local DP (each client clips and noises its own update): what a client's own guarantee is, the Gaussian mechanism on
its one clipped update composed over the rounds it took part in, at :func:`replace_one_multiplier` (any update can
become any other: sensitivity 2C). No amplification by sampling: the client knows it was sampled, and so does
whoever sees its upload. Reported as the largest and the median over the clients that may train.

``value_discretization_interval``: PLDs here are built at :data:`PLD_DISCRETIZATION` (dp-accounting's default is
1e-4): pessimistic, so still an upper bound; measured at q = 0.1, z = 1, delta = 1e-3, 200 rounds, epsilon 7.096193
against 7.096154 at 1e-4, and 3.4 s for the whole per-round series instead of 46 s (1,000 rounds: 23 s; rdp's series
scales one round's divergences, 0.45 s for 1,000 rounds).

This module is torch-free; dp-accounting takes ~0.6 s to import (measured), which is why the server never imports
it: the driver computes the run's series once (:class:`fedsim.plan.RunPlan`) and the server looks values up."""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Literal

import dp_accounting as dpa
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from fedsim.config.privacy import LARGEST_MULTIPLIER, SMALLEST_MULTIPLIER

PLD_DISCRETIZATION = 1e-3

# L2 sensitivity of one clipped update under replace-one neighbouring, in units of the clip norm C: the update u
# (||u|| <= C) becomes any u' (||u'|| <= C), so ||u - u'|| <= 2C. Where the mechanism's code states another bound,
# change it here.
REPLACE_ONE_SENSITIVITY = 2.0


def replace_one_multiplier(noise_multiplier: float) -> float:
    """z (noise std / C) as the ratio dp-accounting's replace-one accounting reads: noise std / sensitivity."""
    return noise_multiplier / REPLACE_ONE_SENSITIVITY


@dataclass(frozen=True)
class Accounting:
    """What a run's guarantee depends on besides z: the mechanism's place, the sampling and the accountant.
    ``population``: the clients that may train (eval.unseen held out); ``cohort``: the fixed sampler's round size;
    ``fraction``: Poisson's q."""
    dp: Literal["central", "local"]
    sampling: Literal["fixed", "poisson"]
    population: int
    cohort: int
    fraction: float
    delta: float
    accountant: Literal["rdp", "pld"]

    @property
    def neighbouring(self) -> dpa.NeighboringRelation:
        fixed_size = self.dp == "central" and self.sampling == "fixed"
        return dpa.NeighboringRelation.REPLACE_ONE if fixed_size else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

    @property
    def sampling_rate(self) -> float:
        """The chance a given client takes part in a round: q, or K / N."""
        return self.fraction if self.sampling == "poisson" else self.cohort / self.population

    def round_event(self, noise_multiplier: float) -> dpa.DpEvent:
        """One round of central DP."""
        if noise_multiplier <= 0:
            return dpa.NonPrivateDpEvent()
        if self.sampling == "poisson":
            return dpa.PoissonSampledDpEvent(self.fraction, dpa.GaussianDpEvent(noise_multiplier))
        return dpa.SampledWithoutReplacementDpEvent(
            self.population, self.cohort, dpa.GaussianDpEvent(replace_one_multiplier(noise_multiplier)))

    def fresh_accountant(self) -> dpa.PrivacyAccountant:
        if self.accountant == "pld":
            return dpa.pld.PLDAccountant(self.neighbouring, value_discretization_interval=PLD_DISCRETIZATION)
        return dpa.rdp.RdpAccountant(neighboring_relation=self.neighbouring)

    # -- central ------------------------------------------------------------------------------------
    def epsilon(self, noise_multiplier: float, rounds: int) -> float:
        """Central epsilon after ``rounds`` rounds, as dp-accounting's accountant composes them."""
        accountant = self.fresh_accountant()
        with quiet_library():
            accountant.compose(dpa.SelfComposedDpEvent(self.round_event(noise_multiplier), rounds))
            return float(accountant.get_epsilon(self.delta))

    def epsilons(self, noise_multiplier: float, rounds: int) -> list[float]:
        """Central epsilon after each of rounds 1..``rounds``, the one round's privacy computed once: RDP composes
        linearly (round r's is r times the one round's), a PLD by convolving the one round's into the last."""
        if noise_multiplier <= 0:
            return [math.inf] * rounds
        if self.accountant == "rdp":
            accountant = self.fresh_accountant()
            assert isinstance(accountant, dpa.rdp.RdpAccountant)
            with quiet_library():
                accountant.compose(self.round_event(noise_multiplier))
            return [float(rdp_privacy_accountant.compute_epsilon(accountant.orders, r * accountant.rdp, self.delta)[0])
                    for r in range(1, rounds + 1)]
        one = self.round_pld(noise_multiplier)
        spent, out = one, [float(one.get_epsilon_for_delta(self.delta))]
        for _ in range(rounds - 1):
            spent = spent.compose(one)
            out.append(float(spent.get_epsilon_for_delta(self.delta)))
        return out

    def round_pld(self, noise_multiplier: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        """One Poisson-sampled round's PLD, built as dp-accounting's PLDAccountant builds it."""
        return privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=noise_multiplier, value_discretization_interval=PLD_DISCRETIZATION,
            sampling_prob=self.fraction, neighboring_relation=self.neighbouring)

    # -- local --------------------------------------------------------------------------------------
    def client_epsilon(self, noise_multiplier: float, participations: int) -> float:
        """Local DP: one client's epsilon after taking part ``participations`` times. k Gaussian releases at
        multiplier s are one at s / sqrt(k): rdp composes them; pld's limit for a Gaussian is its exact (analytic)
        epsilon, which dp-accounting computes directly (Balle and Wang 2018)."""
        if participations == 0:
            return 0.0
        if noise_multiplier <= 0:
            return math.inf
        effective = replace_one_multiplier(noise_multiplier)
        if self.accountant == "pld":
            return float(dpa.get_epsilon_gaussian(effective / math.sqrt(participations), self.delta))
        accountant = self.fresh_accountant()
        accountant.compose(dpa.GaussianDpEvent(effective), participations)
        return float(accountant.get_epsilon(self.delta))

    # -- calibration --------------------------------------------------------------------------------
    def calibrate(self, target_epsilon: float, rounds: int, most_participations: int) -> float:
        """The smallest z (to a relative 1e-4) whose epsilon at ``rounds`` is at most ``target_epsilon``: central,
        the run's; local, its most frequent client's (``most_participations``)."""
        if self.dp == "local":
            return smallest_multiplier(lambda z: self.client_epsilon(z, most_participations), target_epsilon)
        return smallest_multiplier(lambda z: self.epsilon(z, rounds), target_epsilon)


class BudgetUnreachable(ValueError):
    """No noise multiplier up to :data:`LARGEST_MULTIPLIER` spends as little as the target."""


def smallest_multiplier(epsilon_of: Callable[[float], float], target: float, rtol: float = 1e-4) -> float:
    """Bisection over a decreasing epsilon(z) within [SMALLEST_MULTIPLIER, LARGEST_MULTIPLIER] (the range the
    config accepts): a bracket by doubling from 1, then halves until the bracket is within ``rtol``; returns the
    bracket's upper end, which meets ``target``. A target even the smallest z meets gets that z (the run then spends
    less than its budget, and says how much)."""
    if epsilon_of(SMALLEST_MULTIPLIER) <= target:
        return SMALLEST_MULTIPLIER
    low, high = SMALLEST_MULTIPLIER, 1.0
    while epsilon_of(high) > target:
        low, high = high, 2 * high
        if high > LARGEST_MULTIPLIER:
            raise BudgetUnreachable(f"no noise multiplier up to {LARGEST_MULTIPLIER:g} reaches epsilon {target:g}")
    while high - low > rtol * high:
        middle = (low + high) / 2
        low, high = (low, middle) if epsilon_of(middle) <= target else (middle, high)
    return high


@contextmanager
def quiet_library() -> Iterator[None]:
    """dp-accounting warns (through absl) for each fractional RDP order whose series does not converge, then leaves
    that order out: epsilon stays an upper bound, and the warnings would fill a run's console."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
