"""System heterogeneity on a virtual clock: each client's device (compute speed, bandwidths), when it can be
selected, whether it drops out, and Bonawitz-style rounds that select more clients than needed and close at a
deadline or once enough have reported.

Everything here is a pure function of the seed, the config and the clients' data sizes, never of how many
workers run or how fast they are: who takes part in a round, and when each round starts and ends in simulated
time, is known before any worker trains. That is what keeps a heterogeneous run bit-identical for any number of
workers and after any resume (the clock is recomputed, not stored).

A client's simulated time in a round = its samples x the method's epochs / its speed + the broadcast's bytes /
its download bandwidth + its uploads' bytes / its upload bandwidth. A client that drops out does so at a point
drawn uniformly through that time; a client that is not a participant (it dropped out, or reported after the
round closed) does not train, so its own state stays as it was.

The clients' devices and availability are in ``fedsim.plan.devices``; FedBuff's asynchronous schedule, a clock
of its own, in ``fedsim.plan.async_clock``.

This module imports no torch: the server's process builds the clock."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedsim.config import SystemConfig
from fedsim.plan.devices import Availability, Devices, build_availability, build_devices
from fedsim.plan.population import Population

SELECTION_STREAM = 0x5A3  # sample_clients' stream: with every client available the selection is today's sample
DROPOUT_STREAM = 0xD809


@dataclass(frozen=True)
class RoundTime:
    """One round on the virtual clock."""
    round: int
    start_s: float  # when it started (after waiting for a client to come online)
    seconds: float  # how long it lasted: to the target-th report, the deadline, or the last report
    selected: tuple[int, ...]
    participants: tuple[int, ...]  # reported before the round closed: the clients that train
    dropouts: tuple[int, ...]
    late: tuple[int, ...]  # reported after the round closed (or would have): their work is discarded
    versions: tuple[int, ...] = ()  # async: per participant, the server step whose model it trained from
    live_versions: tuple[int, ...] = ()  # async: older models that clients still training after this step hold

    def staleness(self) -> tuple[int, ...]:
        """async: per participant, server steps taken since it received its model (0: the freshest)."""
        return tuple(self.round - 1 - v for v in self.versions)

    @property
    def end_s(self) -> float:
        return self.start_s + self.seconds

    def row(self) -> dict[str, Any]:
        """The round's columns in rounds.jsonl."""
        row: dict[str, Any] = {"sim_start_s": self.start_s, "sim_seconds": self.seconds, "sim_time_s": self.end_s,
               "selected": len(self.selected), "participants": list(self.participants),
               "dropouts": list(self.dropouts), "late": list(self.late)}
        return row | ({"staleness": list(self.staleness())} if self.versions else {})


@dataclass(frozen=True, eq=False)
class SystemModel:
    """A run's devices and availability, built once on the driver (traces are read there only)."""
    cfg: SystemConfig
    devices: Devices
    availability: Availability

    @property
    def digest(self) -> str:
        """What the clock is built from beyond the config: a trace file edited before a resume changes it."""
        h = hashlib.sha256()
        d, a = self.devices, self.availability
        for part in (d.speed, d.up_bytes_s, d.down_bytes_s, *(() if a.phase is None else (a.phase,)), *a.intervals):
            h.update(np.ascontiguousarray(part, np.float64).tobytes() + b"|")
        h.update("|".join(d.kind).encode())
        return h.hexdigest()[:16]


@dataclass(eq=False)
class Clock:
    """The rounds' times and participants, computed in order and kept (each round starts when the last ended)."""
    system: SystemModel
    seed: int
    population: Population  # who may be selected (eval.unseen holds clients out) and the round's target
    work: np.ndarray  # per client: samples x epochs of one round
    bytes_down: int
    bytes_up: int
    rounds: list[RoundTime] = field(default_factory=list)

    @property
    def num_clients(self) -> int:
        return len(self.work)

    def round(self, round_idx: int) -> RoundTime:
        while len(self.rounds) < round_idx:
            start = self.rounds[-1].end_s if self.rounds else 0.0
            self.rounds.append(self._next(len(self.rounds) + 1, start))
        return self.rounds[round_idx - 1]

    def durations(self, clients: np.ndarray) -> np.ndarray:
        d = self.system.devices
        seconds: np.ndarray = (self.work[clients] / d.speed[clients] + self.bytes_down / d.down_bytes_s[clients]
                + self.bytes_up / d.up_bytes_s[clients])
        return seconds

    def _next(self, round_idx: int, start: float) -> RoundTime:
        cfg = self.system.cfg
        trainable = self.population.mask
        start = self.system.availability.next_on(start, trainable)
        pool = np.flatnonzero(self.system.availability.available(start, self.num_clients) & trainable)
        target = self.population.cohort
        count = min(len(pool), math.ceil(target * (1 + cfg.over_selection) - 1e-9))  # 10 x 1.3 is 13, not 14
        rng = np.random.default_rng([self.seed, round_idx, SELECTION_STREAM])
        selected = np.sort(rng.choice(pool, size=count, replace=False))
        draw = np.random.default_rng([self.seed, round_idx, DROPOUT_STREAM]).random(self.num_clients)[selected]
        dropped = draw < cfg.dropout
        duration = self.durations(selected)
        # A dropout leaves at a point uniform through its work: draw / p is uniform on [0, 1) given draw < p.
        gone_at = np.where(dropped, duration * (draw / cfg.dropout if cfg.dropout else 0.0), np.inf)
        order = sorted((float(duration[i]), int(selected[i])) for i in np.flatnonzero(~dropped))
        close = cfg.deadline_s if cfg.deadline_s is not None else math.inf
        on_time = [(t, c) for t, c in order if t <= close]
        participants = on_time[:target]
        if len(participants) == target:
            seconds = participants[-1][0]  # enough reports: the round closes at once
        elif cfg.deadline_s is not None:
            seconds = cfg.deadline_s
        else:  # it waits for every client still working, and learns of a dropout when it leaves
            seconds = max([t for t, _ in order] + [float(g) for g in gone_at[dropped]], default=0.0)
        chosen = {c for _, c in participants}
        return RoundTime(round_idx, start, float(seconds), tuple(int(c) for c in selected),
                         tuple(sorted(chosen)), tuple(int(c) for c in selected[dropped]),
                         tuple(c for _, c in order if c not in chosen))


# -- building the model from the config (on the driver) ------------------------------------------------
def build_system(cfg: SystemConfig, seed: int, num_clients: int) -> SystemModel | None:
    if cfg.devices is None:
        return None
    return SystemModel(cfg, build_devices(cfg.devices, seed, num_clients),
                       build_availability(cfg.availability, seed, num_clients))
