"""FedBuff's schedule on the virtual clock: clients train concurrently, each from the model the server held when
it was dispatched, and the server steps every ``buffer`` reports (``system.mode: async``). A pure function of the
seed, like the synchronous clock it extends (``fedsim.plan.system``).

This module imports no torch: the server's process builds the clock."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fedsim.plan.system import Clock, RoundTime

ASYNC_STREAM = 0xA5F0
Event = Literal["done", "drop", "retry"]  # what happens at a FedBuff event: a report, a dropout, a slot tried again


@dataclass(eq=False)
class AsyncClock(Clock):
    """FedBuff's schedule (Nguyen et al., AISTATS 2022, Algorithm 1): ``concurrency`` clients train at once, each
    from the model the server held when it was dispatched; every report goes into a buffer, and each
    ``buffer`` reports the server takes a step (a "round" here). A report or a dropout frees its slot, which is
    given at once to a client drawn from those on, not training, and not already in the buffer (a client
    reports at most once per step); with none on, the slot waits for the first to come on. Every draw is keyed
    by the dispatch's index, so the schedule is a function of the seed alone."""
    concurrency: int = 1
    buffer: int = 1
    _events: list[tuple[float, int, int, Event]] = field(default_factory=list)  # heap: (time, sequence, client, kind)
    _flight: dict[int, tuple[int, bool]] = field(default_factory=dict)  # client -> (model version, will it report)
    _buffered: list[tuple[int, int]] = field(default_factory=list)  # (client, version) reported since the last step
    _idle: int = 0  # slots with no client that could take them (all training or buffered): refilled after a step
    _version: int = 0  # the server's model: x_0 at the start, x_r after step r
    _dispatches: int = 0
    _window: dict[str, list[int]] = field(default_factory=lambda: {"selected": [], "dropouts": []})

    def round(self, round_idx: int) -> RoundTime:
        if not self._dispatches:
            for _ in range(self.concurrency):
                self._dispatch(0.0)
        while len(self.rounds) < round_idx:
            self.rounds.append(self._step())
        return self.rounds[round_idx - 1]

    def _push(self, t: float, client: int, kind: Event) -> None:
        heapq.heappush(self._events, (t, self._dispatches, client, kind))

    def _dispatch(self, t: float) -> None:
        eligible = self.population.mask.copy()
        eligible[list(self._flight)] = False
        eligible[[c for c, _ in self._buffered]] = False
        if not eligible.any():
            self._idle += 1
            return
        on = np.flatnonzero(self.system.availability.available(t, self.num_clients) & eligible)
        if not on.size:
            self._push(self.system.availability.next_on(t, eligible), -1, "retry")
            self._dispatches += 1
            return
        rng = np.random.default_rng([self.seed, self._dispatches, ASYNC_STREAM])
        client = int(rng.choice(on))
        draw, duration = rng.random(), float(self.durations(np.array([client]))[0])
        drops = draw < self.system.cfg.dropout
        self._push(t + duration * (draw / self.system.cfg.dropout if drops else 1.0), client, "drop" if drops else "done")
        self._dispatches += 1
        self._flight[client] = (self._version, not drops)
        self._window["selected"].append(client)

    def _step(self) -> RoundTime:
        start = self.rounds[-1].end_s if self.rounds else 0.0
        while True:
            t, _, client, kind = heapq.heappop(self._events)
            if kind == "retry":
                self._dispatch(t)
                continue
            version, _ = self._flight.pop(client)
            if kind == "drop":
                self._window["dropouts"].append(client)
                self._dispatch(t)
                continue
            self._buffered.append((client, version))
            if len(self._buffered) == self.buffer:
                return self._close(start, t)
            self._dispatch(t)

    def _close(self, start: float, t: float) -> RoundTime:
        reports = sorted(self._buffered)
        live = sorted({v for v, reports_back in self._flight.values() if reports_back})
        self._version += 1  # the slots given out from here on get this step's model
        step = RoundTime(self._version, start, t - start, tuple(self._window["selected"]),
                         tuple(c for c, _ in reports), tuple(self._window["dropouts"]), (),
                         versions=tuple(v for _, v in reports), live_versions=tuple(live))
        self._buffered, self._window = [], {"selected": [], "dropouts": []}
        refill, self._idle = self._idle + 1, 0  # the report's own slot, and those that found no client
        for _ in range(refill):
            self._dispatch(t)
        return step
