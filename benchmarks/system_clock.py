"""What the virtual clock costs a round. Two measurements in one process:

  1. The clock alone: ``Clock.round`` with every system setting on (mobile devices, diurnal availability,
     10% dropout, 30% over-selection, a deadline) at N = 20, 1,000 and 100,000 clients, in microseconds per
     round, against the mean round time of run A below.
  2. End to end: experiments/quickstart.yaml's FedPer variant for --rounds rounds, A without ``system:`` and B
     with ``system.devices.preset=lognormal`` (no dropout or deadline, so the same clients train and their
     per-client metrics must be identical), interleaved A, B, A, B, ... for --reps repetitions; the median of
     each run's round times (rounds.jsonl ``seconds``, round 1 left out: it warms up) and B / A.

    .venv/bin/python benchmarks/system_clock.py [--rounds 4] [--reps 2] [--work DIR]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fedsim.cli.main import main as fedsim
from fedsim.config import SystemConfig, load_tree
from fedsim.metrics.logger import read_jsonl
from fedsim.plan import Population
from fedsim.plan.system import Clock, build_system
from fedsim.sweep.expand import expand_sweep

import _common
from _common import SMOKE_OVERRIDES, parse

REPO = Path(__file__).resolve().parent.parent
EVERYTHING = {"devices": {"preset": "mobile"}, "dropout": 0.1, "over_selection": 0.3, "deadline_s": 30.0,
              "availability": {"pattern": "diurnal", "period_s": 3600.0, "on_fraction": 0.5}}


def clock_microseconds(num_clients: int, rounds: int = 200) -> float:
    cfg = SystemConfig.model_validate(EVERYTHING)
    clock = Clock(build_system(cfg, 0, num_clients), 0, Population(num_clients, fraction=0.1),
                  np.full(num_clients, 500.0), 460_000, 460_000)
    started = time.perf_counter()
    clock.round(rounds)
    return (time.perf_counter() - started) / rounds * 1e6


def round_seconds(out_dir: Path, rounds: int, clocked: bool) -> tuple[float, list[dict]]:
    overrides = ["sweep.algorithm=[fedper]", f"train.rounds={rounds}", f"out_dir={out_dir}",
                 *(SMOKE_OVERRIDES if _common.SMOKE else [])]
    if clocked:
        overrides.append("system.devices.preset=lognormal")
    config = REPO / "experiments" / "quickstart.yaml"
    [cfg] = expand_sweep(load_tree(config, overrides))
    if fedsim(["run", str(config), "--quiet", "--overwrite", *overrides]) != 0:
        raise SystemExit(f"fedsim run {' '.join(overrides)} failed")
    run_dir = out_dir / cfg.name
    rows = read_jsonl(run_dir / "rounds.jsonl")
    return statistics.median(r["seconds"] for r in rows[1:]), read_jsonl(run_dir / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one, removed)")
    args = parse(parser, rounds=2, reps=1)
    work = args.work or Path(tempfile.mkdtemp(prefix="fedsim-clock-bench-"))
    times: dict[bool, list[float]] = {False: [], True: []}
    metrics: dict[bool, list[dict]] = {}
    try:
        for rep in range(args.reps):
            for clocked in (False, True):
                seconds, metrics[clocked] = round_seconds(work / f"{rep}-{clocked}", args.rounds, clocked)
                times[clocked].append(seconds)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    a, b = statistics.median(times[False]), statistics.median(times[True])
    print(f"end to end, quickstart FedPer, {args.rounds} rounds x {args.reps} reps (median round, round 1 left out)")
    print(f"  A  no system:                  {a:7.3f} s per round  x1.000")
    print(f"  B  system.devices=lognormal:   {b:7.3f} s per round  x{b / a:.3f}")
    print(f"  every A and B round time: {[round(t, 3) for t in times[False]]} / {[round(t, 3) for t in times[True]]}")
    print(f"  per-client metrics identical: {'yes' if metrics[False] == metrics[True] else 'NO'}")
    print("the clock alone (every system setting on), per round, against A's round:")
    for n in (20, 1_000, 100_000):
        us = clock_microseconds(n)
        print(f"  N = {n:>7,}: {us:10.1f} us  = {us / 1e6 / a:.2e} of a quickstart round")


if __name__ == "__main__":
    main()
