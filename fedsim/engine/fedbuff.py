"""FedBuff's server step for asynchronous rounds (system.mode: async; Nguyen et al. 2022, Algorithm 1):
x_r = x_(r-1) + server_lr x sum_j a_j s_j (x_j - x_(v_j)) / sum_j a_j, a_j = 1 (system.async_weighting: uniform, the
paper's mean of the K updates) or n_j, s_j the staleness factor; with system.server_momentum m > 0 the step is
server_lr x v_r, v_r = m v_(r-1) + that mean update (torch SGD's momentum on the pseudo-gradient, as FLSim's FedBuff
aggregator steps its server optimizer: flsim/optimizers/async_aggregators.py, FedBuffAggregator._update_global_model).
The workers sum sum_j a_j s_j x_j / sum_j a_j exactly; the models the clients started from, x_(v_j), are the
server's own: kept here (and checkpointed) while a client still trains from one, and subtracted here.

This module imports no torch (the server's process does not)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.core.protocol import WEIGHTS, ClientReport, FixedPointScales
from fedsim.plan.system import RoundTime

MODEL_PREFIX = "model_at_step_"  # checkpointed server state: an older global model asynchronous clients still hold
VELOCITY = "fedbuff_velocity"  # checkpointed server state: the server step's momentum buffer (server_momentum > 0)


@dataclass(frozen=True)
class Step:
    """One asynchronous step's terms: per kept client in client order, its coefficient a_j s_j / sum_j a_j and the
    model it started from; and the rescaling sum_j a_j / sum_j a_j s_j of the statistics' mean."""
    terms: list[tuple[float, np.ndarray]]
    rescale: float
    server_lr: float
    statistics: np.ndarray  # where the shared vector holds buffers (BatchNorm's statistics), not parameters
    momentum: float = 0.0
    velocity: np.ndarray | None = None  # the momentum buffer, updated in place slice by slice (momentum > 0)

    def apply(self, current: np.ndarray, mean: np.ndarray, start: int, end: int) -> np.ndarray:
        """The step on one tensor of the weights, ``current[start:end]`` (float64, clients in order: the same for
        any number of workers and any tensor split, since every operation is element by element)."""
        started_from = np.zeros(end - start, np.float64)
        for coefficient, model in self.terms:
            started_from += coefficient * model[start:end]
        update = mean - started_from
        if self.velocity is not None:
            velocity = self.momentum * self.velocity[start:end].astype(np.float64) + update
            velocity[self.statistics[start:end]] = 0.0  # statistics are not stepped (below)
            self.velocity[start:end] = velocity
            update = velocity
        stepped = current[start:end] + self.server_lr * update
        # Statistics (BatchNorm's running means and variances) are not parameters to step: a difference of stale
        # variances can go negative (the first stragglers run scored NaN). They take the reports' staleness-
        # weighted mean, sum_j a_j s_j x_j / sum_j a_j s_j, a convex combination like FedAvg's.
        statistics = self.statistics[start:end]
        stepped[statistics] = mean[statistics] * self.rescale
        return stepped


class FedBuff:
    """The older global models asynchronous clients still train from (``models``: the step's version -> weights),
    and the step over them."""

    def __init__(self, server_lr: float, statistics: np.ndarray, momentum: float = 0.0):
        self.server_lr = server_lr
        self.statistics = statistics
        self.momentum = momentum
        self.models: dict[int, np.ndarray] = {}
        self.velocity: np.ndarray | None = None  # the momentum buffer, from the first step on (momentum > 0)

    def step(self, scaling: FixedPointScales, kept: list[ClientReport], timing: RoundTime,
             current: np.ndarray) -> Step:
        """The terms of this step, ``current`` being the global weights the step starts from."""
        version = dict(zip(timing.participants, timing.versions))
        weight = {r.client: 1 if scaling.uniform[WEIGHTS] else r.n_train for r in kept}
        total = sum(weight.values())
        terms = [(weight[r.client] * scaling.factors[r.client] / total, self.model(version[r.client], timing, current))
                 for r in kept]
        rescale = total / sum(weight[r.client] * scaling.factors[r.client] for r in kept)
        if self.momentum > 0 and self.velocity is None:
            self.velocity = np.zeros(current.size, np.float32)
        return Step(terms, rescale, self.server_lr, self.statistics, self.momentum, self.velocity)

    def model(self, version: int, timing: RoundTime, current: np.ndarray) -> np.ndarray:
        return current if version == timing.round - 1 else self.models[version]

    def keep(self, previous: np.ndarray, timing: RoundTime) -> None:
        """After an asynchronous step: keep the older models that clients still training hold, drop the rest."""
        held = {**self.models, timing.round - 1: previous}
        self.models = {v: held[v] for v in timing.live_versions}

    def checkpointed(self) -> dict[str, np.ndarray]:
        """The models and the momentum buffer, as entries of the checkpoint's server state."""
        velocity = {} if self.velocity is None else {VELOCITY: self.velocity}
        return {f"{MODEL_PREFIX}{version}": model for version, model in self.models.items()} | velocity

    def restore(self, server_state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take the models and the momentum buffer out of a checkpoint's server state; returns the rest of it."""
        self.models = {int(name[len(MODEL_PREFIX):]): v for name, v in server_state.items()
                       if name.startswith(MODEL_PREFIX)}
        velocity = server_state.get(VELOCITY)
        self.velocity = None if velocity is None else np.array(velocity, np.float32)  # a writable copy
        return {name: v for name, v in server_state.items() if not name.startswith(MODEL_PREFIX) and name != VELOCITY}
