"""How a round's uploads become the next server state, chosen once when the server is made (:func:`reduction_for`),
as Flower's Strategy is: a round never asks which one it runs.

- :class:`SumReduction`: the workers sum their clients' uploads exactly in fixed point (``FixedPointScales``),
  masked under secure aggregation; the server turns the sums into means, noised under central DP, and hands them to
  the method's server hook, tensor by tensor where the hook allows.
- :class:`BufferedSums`: FedBuff's asynchronous step (system.mode: async): exact sums of staleness-scaled uploads,
  each client sent the model it was dispatched with, and FedBuff's step on the weights' means first.
- :class:`ReplyReduction`: the server receives every kept client's uploads (a method that folds replies itself,
  or a robust rule, server.aggregator, in place of the mean).

This module imports no torch (the server's process does not)."""
from __future__ import annotations

from typing import Any

import numpy as np

from fedsim.core.aggregate import FixedPoint, RoundSums
from fedsim.core.pages import release_shared
from fedsim.core.protocol import WEIGHTS, ClientReport, FixedPointScales, Reply, WorkerPartial, WorkerReplies
from fedsim.core.robust import robust_means
from fedsim.engine.server_state import ServerState
from fedsim.plan import RunPlan
from fedsim.plan.async_clock import AsyncClock
from fedsim.plan.system import RoundTime
from fedsim.privacy.secagg import PairwiseMasks

# A round's clients grouped by the model they start from: None for the server's current one, else an older model.
Models = list[tuple[list[int], np.ndarray | None]]


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class Reduction:
    """A round's reduction in the order the server runs it: ``configure`` before dispatch, ``call`` per worker,
    ``add`` per worker's answer, ``close`` once all are in, ``failure`` and ``update`` on the kept reports."""

    def __init__(self, plan: RunPlan, state: ServerState):
        self.plan = plan
        self.algorithm = plan.algorithm
        self.state = state
        self.tensor_offsets = plan.model.layouts["shared"].offsets  # fixed-point scales and means are per tensor
        self.shared_size = plan.model.initial["shared"].size

    def configure(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> None:
        """Fix what the round's workers are sent beside the model."""

    def models(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> Models:
        """A synchronous round sends every client the server's current model."""
        return [(sampled, None)]

    def call(self, worker: Any, broadcast: Any, clients: list[int], round_idx: int) -> Any:
        raise NotImplementedError

    def add(self, partial: Any) -> list[ClientReport]:
        """Take one worker's answer in; returns its clients' reports."""
        raise NotImplementedError

    def close(self, reports: list[ClientReport]) -> None:
        """Every worker answered (``reports``, in the order they came)."""

    def failure(self, round_idx: int, kept: list[ClientReport]) -> str | None:
        """Why this round's kept reports cannot be reduced, if they cannot."""
        return None

    def update(self, round_idx: int, kept: list[ClientReport], timing: RoundTime | None) -> bool:
        """The next server state from the kept clients (at least one); whether it changed."""
        raise NotImplementedError

    def after_update(self, previous: np.ndarray, timing: RoundTime | None) -> None:
        """After the round's update, ``previous`` the global weights it started from."""

    def release_noise_alone(self, round_idx: int) -> None:
        """Central DP under Poisson sampling with nobody kept: the round still releases the noise over q x N, as the
        accountant's mechanism does every round (a model left unmoved would tell that the round was empty)."""
        weights = self.state.values[WEIGHTS].astype(np.float64)
        noisy = self.state.privacy.noisy_mean(round_idx, weights, weights, self.tensor_offsets,
                                              list(range(len(self.tensor_offsets) - 1)), 0)
        values = dict(self.state.values)
        self.algorithm.server_update(values, {WEIGHTS: noisy}, 0, self.plan.num_clients)
        self.state.values = values


class SumReduction(Reduction):
    """Exact sums from the workers, turned into means on the server."""

    def __init__(self, plan: RunPlan, state: ServerState):
        super().__init__(plan, state)
        self.scaling: FixedPointScales | None = None
        self.masks: PairwiseMasks | None = None
        self.sums: RoundSums | None = None

    def configure(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> None:
        self.scaling = self.scales(sampled, timing) if sampled else None  # on the clock, possibly nobody samples
        self.masks = self.plan.pairwise_masks(round_idx) if self.scaling else None
        self.sums = RoundSums(self.scaling.scales if self.scaling else (), self.shared_size)

    def call(self, worker: Any, broadcast: Any, clients: list[int], round_idx: int) -> Any:
        return worker.train_and_sum.remote(broadcast, clients, round_idx, self.scaling, self.masks)

    def add(self, partial: WorkerPartial) -> list[ClientReport]:
        assert self.sums is not None
        self.sums.add(partial.sums, partial.weights)  # then dropped: W partials are never held at once
        return partial.reports

    def close(self, reports: list[ClientReport]) -> None:
        if self.masks is not None and self.sums is not None:  # secure aggregation's recovery: the kept clients' sum
            self.masks.unmask(self.sums.totals, [r.client for r in reports if not r.diverged])

    def scales(self, sampled: list[int], timing: RoundTime | None) -> FixedPointScales:
        """Per upload, the fixed-point scale for this round's exact sums: from the server's current value of
        that upload (the global weights for ``weights``) and the sampled clients' total weight."""
        scales, uniform = {}, {}
        for name, weighting in self.algorithm.uploads.items():
            uniform[name] = (weighting or self.default_weighting) == "uniform"
            total = len(sampled) if uniform[name] else sum(self.plan.train_sizes[c] for c in sampled)
            values = self.state.values
            scales[name] = FixedPoint.plan(values.get(name, values[WEIGHTS]), self.tensor_offsets, total)
        return self.scaled(scales, uniform, timing)

    @property
    def default_weighting(self) -> str:
        return self.plan.cfg.train.weighting

    def scaled(self, scales: dict[str, FixedPoint], uniform: dict[str, bool],
               timing: RoundTime | None) -> FixedPointScales:
        return FixedPointScales(scales, uniform, clip_norm=self.state.privacy.clip_norm)

    def update(self, round_idx: int, kept: list[ClientReport], timing: RoundTime | None) -> bool:
        """Turn the exact sums into means and let the algorithm's server hook make the next global state of
        them, tensor by tensor where the hook allows (``Algorithm.server_by_tensor``): float64 means of one tensor
        at a time, never of the whole model; under central DP, the weights' mean noised first
        (``ServerPrivacy.noisy_mean``)."""
        if not self.shared_size:
            return False
        scaling, sums = self.scaling, self.sums
        assert scaling is not None and sums is not None  # made for every round that sampled clients
        step = self.step(scaling, kept, timing)
        values = self.state.values
        new = {name: np.empty_like(vector) for name, vector in values.items()}
        tensors = range(len(self.tensor_offsets) - 1)
        for group in ([[t] for t in tensors] if self.algorithm.server_by_tensor() else [list(tensors)]):
            start, end = self.tensor_offsets[group[0]], self.tensor_offsets[group[-1] + 1]
            means = {name: _joined([scale.mean(sums.totals[name], sums.weights[name], t) for t in group])
                     for name, scale in scaling.scales.items()}
            means[WEIGHTS] = self.state.privacy.noisy_mean(round_idx, means[WEIGHTS], values[WEIGHTS][start:end],
                                                           self.tensor_offsets, group, len(kept))
            if step:
                means[WEIGHTS] = step.apply(values[WEIGHTS], means[WEIGHTS], start, end)
            part = {name: vector[start:end] for name, vector in values.items()}
            self.algorithm.server_update(part, means, len(kept), self.plan.num_clients)
            for name, vector in new.items():
                vector[start:end] = part[name]
        self.sums = None  # two model sizes of int64, not to be held while the new state is published and evaluated
        for vector in values.values():
            release_shared(vector)  # the round-0 state is the plan's, in Ray's object store
        self.state.values = new
        return True

    def step(self, scaling: FixedPointScales, kept: list[ClientReport], timing: RoundTime | None) -> Any:
        """A synchronous round's means are the new weights' inputs as they are."""
        return None


class BufferedSums(SumReduction):
    """FedBuff's asynchronous step: each client trains from the model it was dispatched with (kept in
    ``FedBuff.models`` since), its upload scaled by its staleness factor (1 + s)^-system.staleness_exponent and
    weighed by system.async_weighting; the step x_r = x_(r-1) + server_lr x (mean - started from) on the weights."""

    def models(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> Models:
        assert timing is not None  # an asynchronous step always runs on the clock
        current = round_idx - 1
        by_version: dict[int, list[int]] = {}
        for client, version in zip(timing.participants, timing.versions):
            by_version.setdefault(version, []).append(client)
        return [(clients, None if version == current else self.state.fedbuff.models[version])
                for version, clients in sorted(by_version.items())]

    @property
    def default_weighting(self) -> str:
        return self.plan.cfg.system.async_weighting

    def scaled(self, scales: dict[str, FixedPoint], uniform: dict[str, bool],
               timing: RoundTime | None) -> FixedPointScales:
        assert timing is not None
        exponent = self.plan.cfg.system.staleness_exponent
        return FixedPointScales(scales, uniform,
                                {c: (1 + s) ** -exponent for c, s in zip(timing.participants, timing.staleness())})

    def step(self, scaling: FixedPointScales, kept: list[ClientReport], timing: RoundTime | None) -> Any:
        assert timing is not None
        return self.state.fedbuff.step(scaling, kept, timing, self.state.values[WEIGHTS])

    def after_update(self, previous: np.ndarray, timing: RoundTime | None) -> None:
        """Keep the model clients still in flight started from."""
        assert timing is not None
        self.state.fedbuff.keep(previous, timing)


class ReplyReduction(Reduction):
    """Every kept client's uploads, folded on the server in client order."""

    def __init__(self, plan: RunPlan, state: ServerState):
        super().__init__(plan, state)
        self.replies: list[Reply] = []

    def configure(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> None:
        self.replies = []

    def call(self, worker: Any, broadcast: Any, clients: list[int], round_idx: int) -> Any:
        return worker.train_and_reply.remote(broadcast, clients, round_idx)

    def add(self, partial: WorkerReplies) -> list[ClientReport]:
        self.replies += partial.replies
        return partial.reports

    def failure(self, round_idx: int, kept: list[ClientReport]) -> str | None:
        """Fewer kept replies than the robust rule is defined for."""
        fewest = self.plan.fewest_replies
        if kept and len(kept) < fewest:
            s = self.plan.cfg.server
            return (f"server.aggregator: {s.aggregator} with server.byzantine={s.byzantine} needs {fewest} replies a "
                    f"round, round {round_idx} kept {len(kept)}; lower server.byzantine or sample more clients "
                    "(train.fraction)")
        return None

    def update(self, round_idx: int, kept: list[ClientReport], timing: RoundTime | None) -> bool:
        replies, self.replies = sorted(self.replies, key=lambda r: r.client), []  # a model size per client
        self.fold(replies)
        return True

    def fold(self, replies: list[Reply]) -> None:
        """The new server state from the round's kept replies (in client order): the method's own hook, or a robust
        rule (server.aggregator) in place of the mean, handed to its server_update on whole vectors."""
        values = dict(self.state.values)
        if self.algorithm.aggregation == "replies":
            self.algorithm.server_replies(values, replies, self.plan.num_clients)
        else:
            s = self.plan.cfg.server
            uploads = {name: [r.uploads[name] for r in replies] for name in self.algorithm.uploads}
            means = robust_means(s.aggregator, s.trim_fraction, s.byzantine, s.krum_select, uploads, WEIGHTS)
            self.algorithm.server_update(values, means, len(replies), self.plan.num_clients)
        for name, vector in self.state.values.items():
            if values.get(name) is not vector:
                release_shared(vector)  # the round-0 state is the plan's, in Ray's object store
        for reply in replies:
            for vector in reply.uploads.values():
                release_shared(vector)  # read through Ray's store: its pages would stay in this process's memory
        self.state.values = values


def reduction_for(plan: RunPlan, state: ServerState) -> Reduction:
    """The run's reduction: replies where the server must see them (``RunPlan.sees_replies``), FedBuff's buffered
    sums on the asynchronous clock, else a synchronous round's exact sums."""
    if plan.sees_replies:
        return ReplyReduction(plan, state)
    if isinstance(plan.clock, AsyncClock):
        return BufferedSums(plan, state)
    return SumReduction(plan, state)
