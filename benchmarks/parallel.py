"""Workers and threads on the quickstart workload (FedPer, 10 clients, k = 4, e = 4, b = 50).

Three engine settings, run interleaved (A, B, C, A, B, C, ...) in one process:
  A  2 workers x 1 thread   (the default: one worker per core)
  B  1 worker  x 1 thread
  C  1 worker  x 2 threads  (cpus_per_worker = 2)
Per-round seconds are the server's own clock (rounds.jsonl), median over rounds and reps; every
round trains all 10 clients and evaluates all of them. The ratios are what matters:
B / A = the speed-up from a second worker, C / A = threads vs workers on 2 cores.

    .venv/bin/python benchmarks/parallel.py              # 2 rounds, 1 rep: ~3 min
    .venv/bin/python benchmarks/parallel.py --rounds 3 --reps 2
"""
from __future__ import annotations

import argparse

from _common import log, machine, measured, median, parse, quickstart, run_fedsim, save

SETTINGS = {
    "2 workers x 1 thread": {"engine.workers": 2, "engine.cpus_per_worker": 1, "engine.threads_per_worker": 1},
    "1 worker x 1 thread": {"engine.workers": 1, "engine.cpus_per_worker": 1, "engine.threads_per_worker": 1},
    "1 worker x 2 threads": {"engine.workers": 1, "engine.cpus_per_worker": 2, "engine.threads_per_worker": 2},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    args = parse(ap, rounds=1, reps=1)

    runs: dict[str, list[dict]] = {k: [] for k in SETTINGS}
    for rep in range(args.reps):
        for label, over in SETTINGS.items():
            r = measured(run_fedsim, quickstart({"train.rounds": args.rounds, "name": "bench-parallel", **over}))
            runs[label].append(r)
            log(f"  rep {rep} {label}: rounds {[round(s, 2) for s in r['round_s']]}, "
                f"others busy {r['others_cores']:.2f} cores")

    base = median([s for r in runs["2 workers x 1 thread"] for s in r["round_s"]])
    print(f"\nquickstart FedPer, {args.rounds} rounds x {args.reps} reps, median seconds per round (server clock)")
    print(f"{'setting':<24}{'s/round':>9}{'vs 2x1':>8}{'end to end s':>14}{'others busy':>13}")
    for label, rs in runs.items():
        per_round = median([s for r in rs for s in r["round_s"]])
        print(f"{label:<24}{per_round:>9.2f}{per_round / base:>8.2f}{median([r['end_to_end_s'] for r in rs]):>14.1f}"
              f"{median([r['others_cores'] for r in rs]):>13.2f}")
    one = median([s for r in runs["1 worker x 1 thread"] for s in r["round_s"]])
    two_threads = median([s for r in runs["1 worker x 2 threads"] for s in r["round_s"]])
    print(f"RATIO (1 worker x 1 thread) / (2 workers x 1 thread): {one / base:.2f}  (ideal 2.0)")
    print(f"RATIO (1 worker x 2 threads) / (2 workers x 1 thread): {two_threads / base:.2f}")
    path = save("parallel", {"args": vars(args), "machine": machine(), "runs": runs})
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
