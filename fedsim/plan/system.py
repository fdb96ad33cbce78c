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

This module imports no torch: the server's process builds the clock."""
from __future__ import annotations

import csv
import hashlib
import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedsim.config import AvailabilityConfig, DevicesConfig, SystemConfig

# The stylized mobile mix: (class, share of clients, speed and bandwidth relative to the median device).
from fedsim.errors import ConfigError
# Not a measured population: an assumed three-tier spread of 16x between the ends; give a trace for real devices.
MOBILE_MIX = (("high-end", 0.25, 4.0), ("mid-range", 0.5, 1.0), ("low-end", 0.25, 0.25))
SPEED_TERCILES = ("slow", "medium", "fast")
BITS_PER_MEGABIT = 1e6
SELECTION_STREAM = 0x5A3  # sample_clients' stream: with every client available the selection is today's sample
DROPOUT_STREAM = 0xD809
DEVICE_STREAM = 0xDE71CE
PHASE_STREAM = 0xD1A1
ASYNC_STREAM = 0xA5F0
Event = Literal["done", "drop", "retry"]  # what happens at a FedBuff event: a report, a dropout, a slot tried again


@dataclass(frozen=True, eq=False)
class Devices:
    """Per client: samples per second, bytes per second up and down, and a device class for fairness breakdowns."""
    speed: np.ndarray
    up_bytes_s: np.ndarray
    down_bytes_s: np.ndarray
    kind: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Availability:
    """When each client can be selected: always, a diurnal cycle (each client on for ``on_fraction`` of every
    ``period_s`` from its own phase), or a trace's intervals repeated every ``period_s``."""
    pattern: str
    period_s: float
    on_fraction: float = 1.0
    phase: np.ndarray | None = None  # diurnal: each client's offset into the cycle, in [0, 1)
    intervals: tuple[np.ndarray, ...] = ()  # trace: per client, an (k, 2) array of [start, end) within a period

    def available(self, t: float, num_clients: int) -> np.ndarray:
        if self.pattern == "always":
            return np.ones(num_clients, bool)
        if self.pattern == "diurnal":
            return np.mod(t / self.period_s + self._phases(), 1.0) < self.on_fraction
        at = math.fmod(t, self.period_s)
        return np.array([bool(((spans[:, 0] <= at) & (at < spans[:, 1])).any()) for spans in self.intervals])

    def next_on(self, t: float, among: np.ndarray) -> float:
        """The first time at or after ``t`` that some client of ``among`` (a mask) is available."""
        if self.pattern == "always":
            return t
        if self.pattern == "diurnal":
            position = np.mod(t / self.period_s + self._phases()[among], 1.0)
            wait = np.where(position < self.on_fraction, 0.0, 1.0 - position) * self.period_s
            return t + float(wait.min())
        if (self.available(t, len(self.intervals)) & among).any():
            return t
        cycle, at = divmod(t, self.period_s)
        starts = np.concatenate([spans[:, 0] for spans, chosen in zip(self.intervals, among) if chosen])
        ahead = starts[starts >= at]
        return cycle * self.period_s + (float(ahead.min()) if ahead.size else self.period_s + float(starts.min()))

    def _phases(self) -> np.ndarray:
        if self.phase is None:  # build_availability always draws them for a diurnal pattern
            raise ValueError("a diurnal availability needs each client's phase")
        return self.phase


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
    fraction: float
    work: np.ndarray  # per client: samples x epochs of one round
    bytes_down: int
    bytes_up: int
    trainable: np.ndarray  # per client: may it be selected (False: held out by eval.unseen)
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
        start = self.system.availability.next_on(start, self.trainable)
        pool = np.flatnonzero(self.system.availability.available(start, self.num_clients) & self.trainable)
        target = max(1, round(self.fraction * int(self.trainable.sum())))
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


def build_devices(cfg: DevicesConfig, seed: int, num_clients: int) -> Devices:
    if cfg.trace is not None:
        return read_device_trace(Path(cfg.trace), num_clients)
    ones = np.ones(num_clients)
    up, down = cfg.up_mbps * BITS_PER_MEGABIT / 8, cfg.down_mbps * BITS_PER_MEGABIT / 8
    rng = np.random.default_rng([seed, DEVICE_STREAM])
    if cfg.preset == "uniform":
        return Devices(cfg.speed * ones, up * ones, down * ones, ("uniform",) * num_clients)
    if cfg.preset == "lognormal":
        spread = np.exp(cfg.sigma * rng.standard_normal((3, num_clients)))
        speed = cfg.speed * spread[0]
        return Devices(speed, up * spread[1], down * spread[2], _terciles(speed))
    tiers = rng.choice(len(MOBILE_MIX), size=num_clients, p=[share for _, share, _ in MOBILE_MIX])
    scale = np.array([factor for _, _, factor in MOBILE_MIX])[tiers]
    return Devices(cfg.speed * scale, up * scale, down * scale, tuple(MOBILE_MIX[t][0] for t in tiers))


def _terciles(speed: np.ndarray) -> tuple[str, ...]:
    rank = np.argsort(np.argsort(speed, kind="stable"), kind="stable")
    return tuple(SPEED_TERCILES[min(2, 3 * int(r) // len(speed))] for r in rank)


def build_availability(cfg: AvailabilityConfig, seed: int, num_clients: int) -> Availability:
    if cfg.pattern == "always":
        return Availability("always", cfg.period_s)
    if cfg.pattern == "diurnal":
        phase = np.random.default_rng([seed, PHASE_STREAM]).random(num_clients)
        return Availability("diurnal", cfg.period_s, cfg.on_fraction, phase=phase)
    assert cfg.trace is not None  # AvailabilityConfig's validator pairs pattern trace with its file
    return Availability("trace", cfg.period_s, intervals=read_availability_trace(Path(cfg.trace), num_clients,
                                                                                  cfg.period_s))


# -- traces: CSV files, checked row by row ----------------------------------------------------------------
def _rows(path: Path, key: str, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """The CSV's rows with their line numbers, after checking it exists and has the columns."""
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise ConfigError(f"{key}: {path} has no column {missing[0]!r}; its header must name "
                                  f"{', '.join(columns)}")
            rows = [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"{key}: cannot read {path} ({err}); give a CSV file") from None
    if not rows:
        raise ConfigError(f"{key}: {path} has no rows; give one per client")
    return rows


def _number(key: str, path: Path, line: int, row: dict[str, str], column: str, positive: bool = True) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a positive number" if positive else "a number at least 0"
        raise ConfigError(f"{key}: {path} line {line}: {column} is {row[column]!r}; give {need}")
    return value


def _client(key: str, path: Path, line: int, row: dict[str, str], num_clients: int) -> int:
    text = (row["client"] or "").strip()
    if not text.isdigit() or int(text) >= num_clients:
        raise ConfigError(f"{key}: {path} line {line}: client {text!r} is not one of the run's clients "
                          f"0..{num_clients - 1}")
    return int(text)


def read_device_trace(path: Path, num_clients: int) -> Devices:
    key = "system.devices.trace"
    rows = _rows(path, key, ("client", "speed", "up_mbps", "down_mbps"))
    values: dict[int, tuple[float, float, float, str | None]] = {}
    for line, row in rows:
        client = _client(key, path, line, row, num_clients)
        if client in values:
            raise ConfigError(f"{key}: {path} line {line}: client {client} appears twice; give one row per client")
        speed, up, down = (_number(key, path, line, row, c) for c in ("speed", "up_mbps", "down_mbps"))
        values[client] = (speed, up * BITS_PER_MEGABIT / 8, down * BITS_PER_MEGABIT / 8, row.get("class") or None)
    absent = [c for c in range(num_clients) if c not in values]
    if absent:
        raise ConfigError(f"{key}: {path} has no row for client {absent[0]} ({len(absent)} of {num_clients} "
                          "clients missing); give one row per client")
    speeds, ups, downs, kinds = (list(column) for column in zip(*(values[c] for c in range(num_clients))))
    speed_array = np.array(speeds)
    kind = tuple(kinds) if all(kinds) else _terciles(speed_array)
    return Devices(speed_array, np.array(ups), np.array(downs), kind)


def read_availability_trace(path: Path, num_clients: int, period_s: float) -> tuple[np.ndarray, ...]:
    key = "system.availability.trace"
    spans: list[list[tuple[float, float]]] = [[] for _ in range(num_clients)]
    for line, row in _rows(path, key, ("client", "start_s", "end_s")):
        client = _client(key, path, line, row, num_clients)
        start, end = (_number(key, path, line, row, c, positive=False) for c in ("start_s", "end_s"))
        if not start < end <= period_s:
            raise ConfigError(f"{key}: {path} line {line}: [{start:g}, {end:g}) is not an interval within one "
                              f"system.availability.period_s={period_s:g}; give start_s < end_s <= period_s")
        spans[client].append((start, end))
    absent = [c for c, s in enumerate(spans) if not s]
    if absent:
        raise ConfigError(f"{key}: {path} gives client {absent[0]} no interval ({len(absent)} of {num_clients} "
                          "clients never available); give every client at least one")
    return tuple(np.array(s, float) for s in spans)


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
        eligible = self.trainable.copy()
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
