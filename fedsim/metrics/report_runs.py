"""Run folders read back for the fairness report: per-client accuracies per round, communication totals, the
virtual clock, and runs that differ only in their seed grouped. Every file is checked as it is read: a damaged
one is a one-line error, never a wrong table."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fedsim import safe_files, strict_yaml
from fedsim.config import result_settings
from fedsim.core import runfiles
from fedsim.core.protocol import SCORED, logged_keys
from fedsim.core.results import read_results
from fedsim.metrics.confidence import Estimate, mean_ci
from fedsim.metrics.summary import summarize
from fedsim.privacy import SPENT

MB = 1e6  # the report's megabyte, in its tables and figures
DIRECTIONS = ("bytes_up", "bytes_down")


@dataclass(frozen=True)
class Run:
    name: str
    algorithm: str
    rounds: int
    finished: bool
    wall_seconds: float | None
    per_round: dict[str, dict[int, list[float]]]  # kind (test's and validation's) -> evaluation round -> per-client values
    comm: dict[str, int | None]  # total bytes per direction; None where the run did not record it
    seed: int | None = None
    settings: str = ""  # every setting that changes results except the seed: runs that share it are seeds of one
    logged: dict[str, list[float]] = field(default_factory=dict)  # a user module's self.log values, last round
    sim_time: dict[int, float] = field(default_factory=dict)  # round -> simulated seconds at its end (system.devices)
    system: dict = field(default_factory=dict)  # summary.json's system block: totals, fairness by device class
    mechanism: dict[str, dict[int, float]] = field(default_factory=dict)  # server-side quantity -> round -> value
    config: dict = field(default_factory=dict)  # the run's stored config.yaml, as written: its receipt's source
    privacy: dict = field(default_factory=dict)  # summary.json's privacy block: delta, noise multiplier, accountant
    optimizers: list[str] | None = None  # summary.json's: the optimizers the run set up (None: a run that predates it)
    spent: dict[int, dict[str, float]] = field(default_factory=dict)  # round -> DP's epsilon by its end (rounds.jsonl)

    def curve(self, kind: str) -> tuple[list[int], list[dict[str, float]]]:
        rounds = sorted(self.per_round[kind])
        return rounds, [summarize(self.per_round[kind][r]) for r in rounds]

    def final(self, kind: str) -> list[float]:
        return self.per_round[kind][max(self.per_round[kind])]


def _read(path: Path, load: Callable[[str], Any]) -> dict:
    """A run folder's JSON or YAML file as a mapping ({} when absent); anything else is a one-line error."""
    if not path.exists():
        return {}
    try:
        value = load(safe_files.read_text(path)) or {}
    except (ValueError, UnicodeDecodeError) as err:  # json's and strict_yaml's errors are ValueErrors
        raise ValueError(f"{path}: unreadable ({str(err).splitlines()[0]}); restore it or leave it out") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: holds a {type(value).__name__}, not a mapping; restore it or leave it out")
    return value


def _checked_records(path: Path) -> list[dict]:
    """metrics.jsonl's rows, each a client record with a round, a client and accuracies in [0, 1]: a torn last
    line is the run still writing (left out); anything else is a one-line error naming file and line."""
    records = read_results(path)
    for number, rec in enumerate(records, start=1):
        bad = [k for k in SCORED if k in rec and not (isinstance(rec[k], (int, float)) and not isinstance(rec[k], bool)
                                                           and 0 <= rec[k] <= 1)]
        if type(rec.get("client")) is not int or bad:
            raise ValueError(f"{path}:{number}: not a client record ({'its ' + bad[0] if bad else 'no client'} is "
                             f"{rec.get(bad[0]) if bad else rec.get('client')!r}); restore the file from the run")
    return records


def load_run(run_dir: Path) -> Run:
    """Read a run folder; curves come from metrics.jsonl so every statistic is computed by `summarize`,
    also for runs written before it reported p10/worst10/jain, and for runs still in progress. Every file is
    checked as it is read: a damaged one is a one-line error, never a wrong table."""
    records = _checked_records(run_dir / runfiles.METRICS)
    if not records:
        raise ValueError(f"{run_dir}: no client metrics (metrics.jsonl missing or empty: not a run folder, or no "
                         "evaluation round has finished yet)")
    summary, config = _read(run_dir / runfiles.SUMMARY, json.loads), _read(run_dir / runfiles.CONFIG, strict_yaml.load)
    per_round: dict[str, dict[int, list[float]]] = {}
    for rec in records:
        for kind in SCORED:
            if rec.get(kind) is not None:
                per_round.setdefault(kind, {}).setdefault(rec["round"], []).append(rec[kind])
    last = max(rec["round"] for rec in records)
    final = [rec for rec in records if rec["round"] == last]
    logged = {key: [rec[key] for rec in final if rec.get(key) is not None] for key in logged_keys(final)}
    rows = read_results(run_dir / runfiles.ROUNDS)
    # Older runs lack summary["comm"] and bytes_down; fall back to the per-round rows, else None.
    comm = summary.get("comm") or {d: sum(r[d] for r in rows if d in r) if any(d in r for r in rows) else None
                                   for d in DIRECTIONS}
    return Run(name=summary.get("name", run_dir.name), algorithm=summary.get("algorithm", config.get("algorithm", "?")),
               rounds=summary.get("rounds", max(r["round"] for r in rows + records)), finished=bool(summary),
               wall_seconds=summary.get("wall_seconds"), per_round=per_round,
               comm={d: comm.get(d) for d in DIRECTIONS}, seed=config.get("seed"), settings=_settings(config),
               logged=logged, sim_time={r["round"]: r["sim_time_s"] for r in rows if "sim_time_s" in r},
               system=summary.get("system", {}), mechanism=_mechanism(rows), config=config,
               privacy=summary.get("privacy", {}), optimizers=summary.get("optimizers"),
               spent={r["round"]: {k: r[k] for k in SPENT if k in r} for r in rows if SPENT[0] in r})


def _mechanism(rows: list[dict]) -> dict[str, dict[int, float]]:
    """rounds.jsonl's ``mechanism`` entries (Algorithm.mechanism) by quantity and round."""
    out: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in (row.get("mechanism") or {}).items():
            out.setdefault(key, {})[row["round"]] = float(value)
    return out


def _settings(config: dict) -> str:
    """Every setting that changes what the run computes, except the seed: runs that share it are seeds of one.
    A config.yaml from an older fedsim (sections missing) is compared as written."""
    settings = result_settings({**config, "engine": config.get("engine", {})})
    return json.dumps({k: v for k, v in settings.items() if k != "seed"}, sort_keys=True, default=str)


def seed_groups(runs: list[Run]) -> list[list[Run]]:
    """Runs that differ only in seed, grouped (groups of two or more, in the order their first run came)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.settings, []).append(run)
    return [g for g in groups.values() if len(g) > 1 and len({r.seed for r in g}) == len(g)]


def group_label(group: list[Run]) -> str:
    """The runs' common name prefix (``fedper-k4-s0``, ``fedper-k4-s1`` -> ``fedper-k4``), else the first name."""
    prefix = re.sub(r"[-_.]+(s|seed)?$", "", os.path.commonprefix([run.name for run in group]))
    return prefix or group[0].name


def seed_curve(group: list[Run], kind: str) -> tuple[list[int], list[Estimate]]:
    """Per evaluation round that every seed reached: the mean over seeds of the client-mean accuracy (in
    points) with its 95% interval."""
    rounds = sorted(set.intersection(*(set(run.per_round.get(kind, {})) for run in group)))
    return rounds, [mean_ci([100 * float(np.mean(run.per_round[kind][r])) for run in group]) for r in rounds]
