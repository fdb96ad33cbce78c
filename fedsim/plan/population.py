"""Who takes part in a run: the clients that may train and how many a round (:class:`Population`, the one statement
that sampling, DP's mechanism, the accountant and the virtual clock read), the samplers that draw them, and the
clients an evaluation round scores. Every draw is a function of the seed and the round alone, never of the number of
workers.

This module imports no torch: the server's process samples."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedsim.config import EvalConfig, RunConfig

POISSON_STREAM = 0x9015  # train.sampling: poisson's draws, a stream apart from the fixed sampler's (0x5A3)


def cohort_size(fraction: float, population: int) -> int:
    """The fixed sampler's clients a round: max(1, round(f x N)) of the N that may train."""
    return max(1, round(fraction * population))


def sample_clients(seed: int, round_idx: int, num_clients: int, fraction: float,
                   pool: np.ndarray | None = None) -> list[int]:
    """max(1, round(f * N)) distinct clients, drawn from (seed, round) only; with ``pool`` (the clients that may
    train, eval.unseen held out) f of the pool, from it. Drawing from the whole range or from a pool holding all
    of it gives the same clients."""
    candidates = num_clients if pool is None else pool
    count = cohort_size(fraction, num_clients if pool is None else len(pool))
    rng = np.random.default_rng([seed, round_idx, 0x5A3])
    return sorted(int(c) for c in rng.choice(candidates, size=count, replace=False))


def poisson_clients(seed: int, round_idx: int, num_clients: int, fraction: float,
                    pool: np.ndarray | None = None) -> list[int]:
    """train.sampling: poisson: each client of the pool joins with probability f, independently, from (seed, round)
    only; possibly nobody (the round trains no one, the server keeps its state, the accountant counts the round)."""
    candidates = np.arange(num_clients) if pool is None else pool
    rng = np.random.default_rng([seed, round_idx, POISSON_STREAM])
    return [int(c) for c in candidates[rng.random(len(candidates)) < fraction]]


def held_out_clients(seed: int, num_clients: int, evaluation: EvalConfig) -> list[int]:
    """eval.unseen: the clients that never train, drawn once from the seed alone (their count checked with the
    config: :func:`fedsim.config.checks.check_population`)."""
    count = evaluation.held_out(num_clients)
    if not count:
        return []
    rng = np.random.default_rng([seed, 0x0B5E])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def evaluation_cohort(seed: int, num_clients: int, clients: int | float | None) -> list[int]:
    """eval.clients: the clients scored on evaluation rounds, drawn once from the seed alone, so the curve
    follows the same clients every round and for any number of workers."""
    count = num_clients if clients is None else clients if isinstance(clients, int) else round(clients * num_clients)
    count = min(max(count, 1), num_clients)
    if count == num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng([seed, 0xC0407])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


@dataclass(frozen=True)
class Population:
    """The run's clients as sampling sees them: ``num_clients`` in all, ``unseen`` of them held out of training
    (eval.unseen, scored only), each round f of the others drawn (train.fraction; train.sampling: fixed draws
    :attr:`cohort` of them, poisson each with probability f)."""
    num_clients: int
    unseen: frozenset[int] = frozenset()
    fraction: float = 1.0
    poisson: bool = False

    @classmethod
    def of(cls, cfg: RunConfig, num_clients: int) -> Population:
        """The population of a run over ``num_clients`` clients, its held-out clients drawn from the seed."""
        unseen = frozenset(held_out_clients(cfg.seed, num_clients, cfg.eval))
        return cls(num_clients, unseen, cfg.train.fraction, cfg.train.sampling == "poisson")

    @property
    def trainable(self) -> int:
        """How many clients may train: N, the accountant's population."""
        return self.num_clients - len(self.unseen)

    @property
    def trainable_clients(self) -> list[int]:
        return [c for c in range(self.num_clients) if c not in self.unseen]

    @cached_property
    def pool(self) -> np.ndarray | None:
        """The clients that may train, when some are held out (None: all of them)."""
        return np.array(self.trainable_clients) if self.unseen else None

    @cached_property
    def mask(self) -> np.ndarray:
        """Per client: may it be selected (False: held out)."""
        trainable = np.ones(self.num_clients, bool)
        trainable[list(self.unseen)] = False
        return trainable

    @property
    def cohort(self) -> int:
        """The fixed sampler's clients a round (the virtual clock's target, FedBuff's default concurrency)."""
        return cohort_size(self.fraction, self.trainable)

    @property
    def expected_cohort(self) -> float:
        """The clients a round trains on average: the cohort, or q x N under Poisson sampling (DP's noise is
        calibrated to it)."""
        return self.fraction * self.trainable if self.poisson else self.cohort

    def sampled(self, seed: int, round_idx: int) -> list[int]:
        """The clients drawn for ``round_idx``, from (seed, round) alone."""
        draw = poisson_clients if self.poisson else sample_clients
        return draw(seed, round_idx, self.num_clients, self.fraction, self.pool)
