"""A run's privacy accounting, from its config and its sampler: the accountant's inputs, the noise multiplier
(given, or calibrated to privacy.target_epsilon before the run), the epsilon spent after each round, the refusal of
a run that would pass its budget, and the summary ``--dry-run`` and summary.json show.

Everything here is a function of the config and the seed (the rounds' samples included), so the driver computes it
once; the server reads the values from the plan it is sent and never imports dp-accounting (~0.6 s). What epsilon
means: :mod:`fedsim.privacy.accountant` and docs/privacy.md."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fedsim.config import RunConfig
from fedsim.errors import ConfigError
from fedsim.privacy import EPSILON, EPSILON_MEDIAN
from fedsim.config.privacy import DEFAULT_DELTA_RULE, default_delta
from fedsim.privacy.accountant import Accounting, BudgetUnreachable
from fedsim.privacy.mechanism import PrivacyPlan, user_level_dp
from fedsim.plan.population import Population

Sampler = Callable[[int], list[int]]  # round -> the clients it draws (RunPlan.sampled)


def run_accounting(cfg: RunConfig, population: int, cohort: int) -> Accounting | None:
    """The accountant's view of a run with privacy.dp central or local (else None): ``population`` clients may
    train, ``cohort`` a round under fixed sampling."""
    p = cfg.privacy
    if p is None or p.dp == "none":
        return None
    return Accounting(p.dp, cfg.train.sampling, population, cohort, cfg.train.fraction,
                      p.delta if p.delta is not None else default_delta(population), p.accountant)


def derive_privacy(cfg: RunConfig, population: Population, sampled: Sampler, num_clients: int) -> PrivacyPlan:
    """The run's DP once (RunPlan.privacy): z (given, or calibrated to privacy.target_epsilon), the mechanism, the
    epsilon after each round and the summary; a run given a z that would pass its target is refused."""
    accounting = run_accounting(cfg, population.trainable, population.cohort)
    assert accounting is not None and cfg.privacy is not None  # called only with DP on (RunPlan.private)
    z = noise_multiplier(cfg, accounting, sampled, num_clients)
    mechanism = user_level_dp(cfg.privacy, z, cfg.seed, population.expected_cohort, population.poisson)
    assert mechanism is not None
    spent = spent_per_round(cfg, accounting, z, sampled, num_clients, population.trainable_clients)
    refuse_over_budget(cfg, spent)
    return PrivacyPlan(mechanism, spent, privacy_summary(cfg, accounting, z, spent))


def participations(sampled: Sampler, num_clients: int, rounds: int) -> Iterator[np.ndarray]:
    """Local DP: each client's count of rounds taken part in, after each of rounds 1..``rounds`` (one array,
    updated in place: rounds x clients counts need not be held at once)."""
    counts = np.zeros(num_clients, np.int64)
    for round_idx in range(1, rounds + 1):
        counts[sampled(round_idx)] += 1
        yield counts


def noise_multiplier(cfg: RunConfig, accounting: Accounting, sampled: Sampler, num_clients: int) -> float:
    """z: privacy.noise_multiplier, or the smallest that spends at most privacy.target_epsilon over train.rounds
    (central: the run's epsilon; local: the most frequent client's)."""
    p = cfg.privacy
    assert p is not None
    if p.noise_multiplier is not None:
        return p.noise_multiplier
    assert p.target_epsilon is not None  # the schema asks for one of the two
    rounds = cfg.train.rounds
    most = 0
    if accounting.dp == "local":
        for counts in participations(sampled, num_clients, rounds):
            most = int(counts.max())  # the counts only grow: the last round's are the run's
    try:
        return accounting.calibrate(p.target_epsilon, rounds, most)
    except BudgetUnreachable as err:
        raise ConfigError(f"privacy.target_epsilon: {err} over train.rounds {rounds}; raise privacy.target_epsilon "
                          "or lower train.rounds") from None


def spent_per_round(cfg: RunConfig, accounting: Accounting, z: float, sampled: Sampler, num_clients: int,
                    pool: list[int]) -> tuple[dict[str, float], ...]:
    """After each round 1..train.rounds: ``privacy/epsilon`` (central: the run's; local: the largest over the
    clients in ``pool``, those that may train) and, for local DP, ``privacy/epsilon_median``."""
    rounds = cfg.train.rounds
    if accounting.dp == "central":
        return tuple({EPSILON: eps} for eps in accounting.epsilons(z, rounds))
    table: dict[int, float] = {}  # participations -> that client's epsilon, each computed once

    def epsilon_of(count: int) -> float:
        if count not in table:
            table[count] = accounting.client_epsilon(z, count)
        return table[count]

    out = []
    for counts in participations(sampled, num_clients, rounds):
        taken = counts[pool]
        median = float(np.median([epsilon_of(int(k)) for k in taken]))
        out.append({EPSILON: epsilon_of(int(taken.max())), EPSILON_MEDIAN: median})
    return tuple(out)


def refuse_over_budget(cfg: RunConfig, spent: tuple[dict[str, float], ...]) -> None:
    """A run given both privacy.noise_multiplier and privacy.target_epsilon whose epsilon would pass the target
    before its last round does not start (with the noise calibrated, it spends at most the target by
    construction)."""
    p = cfg.privacy
    if p is None or p.target_epsilon is None or p.noise_multiplier is None:
        return
    over = next((r for r, row in enumerate(spent, 1) if row[EPSILON] > p.target_epsilon), None)
    if over is None:
        return
    whose = "the most frequent client's epsilon" if p.dp == "local" else "epsilon"
    raise ConfigError(f"privacy.target_epsilon: {whose} would pass {p.target_epsilon:g} at round {over} of "
                      f"{cfg.train.rounds} (noise multiplier {p.noise_multiplier:g}, {p.accountant}, "
                      f"{cfg.train.sampling} sampling); raise privacy.noise_multiplier, set train.rounds to at most "
                      f"{over - 1}, or leave privacy.noise_multiplier out to calibrate it")


def privacy_summary(cfg: RunConfig, accounting: Accounting, z: float,
                    spent: tuple[dict[str, float], ...]) -> dict[str, object]:
    """What summary.json's ``privacy`` and ``--dry-run`` report: epsilon at the final round, delta, z (and whether
    it was calibrated), the accountant, the sampling and its per-round rate q."""
    p = cfg.privacy
    assert p is not None
    final = spent[-1]
    return {"dp": accounting.dp, "epsilon": final[EPSILON],
            **({"epsilon_median": final[EPSILON_MEDIAN]} if EPSILON_MEDIAN in final else {}),
            "delta": accounting.delta, "delta_rule": DEFAULT_DELTA_RULE if p.delta is None else "privacy.delta",
            "noise_multiplier": z, "calibrated": p.noise_multiplier is None,
            "target_epsilon": p.target_epsilon, "accountant": accounting.accountant,
            "sampling": accounting.sampling, "q": accounting.sampling_rate, "clients": accounting.population,
            "rounds": len(spent)}


def describe_privacy(summary: dict[str, Any]) -> str:
    """``--dry-run``'s privacy line."""
    z = f"noise multiplier {summary['noise_multiplier']:.4g}" + (
        f" (calibrated to epsilon {summary['target_epsilon']:g})" if summary["calibrated"] else "")
    eps = summary["epsilon"]
    where = "the most frequent client's " if summary["dp"] == "local" else ""
    spent = "inf (no noise)" if math.isinf(eps) else f"{eps:.4g}"
    return (f"{summary['dp']} DP, {z}, {summary['sampling']} sampling q={summary['q']:.4g} of "
            f"{summary['clients']} clients, delta={summary['delta']:.3g} ({summary['delta_rule']}), {summary['accountant']}: "
            f"{where}epsilon {spent} after round {summary['rounds']}")
