"""Who the clients are on the virtual clock: each client's device (compute speed, bandwidths, a device class) and
when it can be selected, drawn from the seed and the config or read from CSV traces (checked row by row, each
refusal one line naming the file and line). Built once on the driver, where the trace files are.

This module imports no torch."""
from __future__ import annotations

import csv
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from fedsim import storage
from fedsim.config import AvailabilityConfig, DevicesConfig
from fedsim.config.execution import MIN_RATE
from fedsim.errors import ConfigError

# The stylized mobile mix: (class, share of clients, speed and bandwidth relative to the median device).
# Not a measured population: an assumed three-tier spread of 16x between the ends; give a trace for real devices.
MOBILE_MIX = (("high-end", 0.25, 4.0), ("mid-range", 0.5, 1.0), ("low-end", 0.25, 0.25))
SPEED_TERCILES = ("slow", "medium", "fast")
BITS_PER_MEGABIT = 1e6
DEVICE_STREAM = 0xDE71CE
PHASE_STREAM = 0xD1A1


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


def build_devices(cfg: DevicesConfig, seed: int, num_clients: int) -> Devices:
    if cfg.trace is not None:
        return read_device_trace(storage.user_path(cfg.trace), num_clients)
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
    return Availability("trace", cfg.period_s, intervals=read_availability_trace(storage.user_path(cfg.trace), num_clients,
                                                                                  cfg.period_s))


# -- traces: CSV files, checked row by row ----------------------------------------------------------------
def _rows(path: Path, key: str, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """The CSV's rows with their line numbers, after checking it exists and has the columns."""
    try:
        with _regular_file(path, key) as handle:
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


def _regular_file(path: Path, key: str) -> TextIO:
    """``path`` opened for reading as text, refused unless it is a regular file: a FIFO would block the read
    forever, a device never end. Opened without blocking and checked on the open file, so nothing swapped in
    between the check and the read is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ConfigError(f"{key}: {path.resolve()} is not a regular file (a FIFO, a device or a folder); give a "
                          "CSV file")
    os.set_blocking(fd, True)
    return open(fd, newline="", closefd=True)  # noqa: SIM115 - the caller's with-block closes it


def _number(key: str, path: Path, line: int, row: dict[str, str], column: str, positive: bool = True) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value < MIN_RATE):
        need = f"a positive number (at least {MIN_RATE:g})" if positive else "a number at least 0"
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
