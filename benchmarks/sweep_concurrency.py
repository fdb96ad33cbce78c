"""The quickstart sweep (2 methods x 2 seeds) three ways in one process: `fedsim run` (its variants one after
another in one Ray), `fedsim sweep --max-concurrent 1` (Tune trials one after another) and `fedsim sweep
--max-concurrent 2` (two trials at once). Prints each mode's wall time and its ratio to `fedsim run`'s, and checks
that every mode gave every run the same per-client metrics bit for bit.

    .venv/bin/python benchmarks/sweep_concurrency.py [--work DIR] [key=value ...]   # e.g. train.rounds=3
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from fedsim.cli.main import main
from fedsim.config import load_tree
from fedsim.metrics.logger import read_jsonl
from fedsim.sweep.expand import expand_sweep

from _common import SMOKE_OVERRIDES, parse

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "experiments" / "quickstart.yaml"
SWEEP = ["sweep.algorithm=[fedavg, fedper]", "sweep.seed=[0, 1]"]
MODES = {"fedsim run (one after another)": ["run", "--quiet"],
         "fedsim sweep --max-concurrent 1": ["sweep", "--max-concurrent", "1"],
         "fedsim sweep --max-concurrent 2": ["sweep", "--max-concurrent", "2"]}


def timed(mode: list[str], out_dir: Path, overrides: list[str]) -> float:
    command, *flags = mode
    started = time.perf_counter()
    code = main([command, str(CONFIG), *flags, *SWEEP, *overrides, f"out_dir={out_dir}"])
    if code != 0:
        raise SystemExit(f"{' '.join(mode)} exited {code}")
    return time.perf_counter() - started


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one, removed)")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every run, e.g. train.rounds=3")
    args = parse(parser, overrides=[*SMOKE_OVERRIDES, "train.rounds=1", "sweep.seed=[0]"])
    work = args.work or Path(tempfile.mkdtemp(prefix="fedsim-sweep-bench-"))
    names = [cfg.name for cfg in expand_sweep(load_tree(CONFIG, [*SWEEP, *args.overrides]))]
    seconds = {}
    try:
        for i, (label, mode) in enumerate(MODES.items()):
            out_dir = work / f"mode{i}"
            shutil.rmtree(out_dir, ignore_errors=True)
            seconds[label] = timed(mode, out_dir, args.overrides)
        same = all(read_jsonl(work / f"mode{i}" / name / "metrics.jsonl") ==
                   read_jsonl(work / "mode0" / name / "metrics.jsonl") for i in range(1, len(MODES)) for name in names)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    baseline = seconds[next(iter(MODES))]
    print(f"{len(names)} runs: {', '.join(names)}; overrides: {' '.join(args.overrides) or 'none'}")
    for label, s in seconds.items():
        print(f"{label:<34} {s:7.1f} s  x{s / baseline:.2f} of fedsim run")
    print(f"per-client metrics identical across the three modes: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main_()
