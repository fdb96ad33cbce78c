"""The reproduce suites' wall time projected onto a cluster of G GPUs, from the dry run's exact work per run
(sample-steps of training and fine-tuning, `fedsim reproduce --dry-run`) and a measured throughput per model on
one GPU. `fedsim reproduce PAPER --scale paper --max-concurrent G` runs one run per GPU at a time; the runs are
placed longest first on the first free GPU (what Tune's FIFO order over the seed-major run list comes close to),
and the projection is that schedule's length. Arithmetic, not a measurement on a cluster: the rates below are
BENCHMARKS.md's H200 measurements (4 workers x 0.25 GPU, one run per GPU).

    .venv/bin/python benchmarks/reproduce_projection.py [--gpus 4] [--seeds 3] [--rate MODEL=SAMPLE_STEPS_PER_S ...]
"""
from __future__ import annotations

import argparse
import heapq
import tempfile
from pathlib import Path

from fedsim.engine.estimate import estimate
from fedsim.reproduce import PAPERS
from fedsim.reproduce.runner import plan

from _common import parse

# sample-steps/s of one run on one H200, 4 workers x 0.25 GPU (BENCHMARKS.md, "GPU check", 2026-11-30)
MEASURED = {"mobilenet_v1": 8021.0, "cnn4": 21212.0}
SLOWEST = "mobilenet_v1"  # a model without a measured rate is timed at the slowest measured one (an upper bound)


def makespan(durations: list[float], lanes: int) -> float:
    """Longest first onto the first free lane."""
    free = [0.0] * lanes
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def project(paper: str, seeds: int, gpus: int, rates: dict[str, float]) -> None:
    with tempfile.TemporaryDirectory() as runs:
        planned = plan(PAPERS[paper], PAPERS[paper].claims, "paper", seeds, Path(runs))
        work = {}
        for item in (p for p in planned if p.seed == 0):  # every seed does the same work
            e = estimate(item.estimable())
            work[item.key] = (e.model, e.train_sample_steps + e.finetune_sample_steps)
    assumed = sorted({model for model, _ in work.values() if model not in rates})
    seconds = [steps / rates.get(model, rates[SLOWEST]) for item in planned for model, steps in [work[item.key]]]
    serial, parallel = sum(seconds), makespan(seconds, gpus)
    steps = sum(work[item.key][1] for item in planned)
    print(f"{paper}: {len(planned)} runs ({seeds} seeds), {steps:,} sample-steps; one GPU {serial / 3600:.1f} h; "
          f"{gpus} GPUs {parallel / 3600:.1f} h (x{serial / parallel:.2f}; longest run {max(seconds) / 3600:.1f} h)"
          + (f"; {', '.join(assumed)} timed at {SLOWEST}'s rate" if assumed else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rate", action="append", default=[], metavar="MODEL=RATE",
                        help="sample-steps/s of one run of MODEL on one GPU (default: the measured ones)")
    args = parse(parser, seeds=1)
    rates = dict(MEASURED)
    for given in args.rate:
        model, _, value = given.partition("=")
        rates[model] = float(value)
    for paper in sorted(PAPERS):
        project(paper, args.seeds, args.gpus, rates)


if __name__ == "__main__":
    main()
