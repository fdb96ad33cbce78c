"""Workers per core when a round's clients do not split evenly over the workers: `fedsim reproduce fedbabu
--scale cpu` samples 5 of 20 clients a round (f = 0.25), so 2 workers train them 3 + 2 and one core idles for a
third of every training round. More workers than cores (fractional engine.cpus_per_worker) let the
operating system share the cores instead; the results stay the same (the engine is exact for any worker count).

Settings, run interleaved (A, B, C, A, B, C, ...) in one process, on two of the suite's own runs (FedBABU: any
worker trains any client, each round's sample is split afresh; FedPer: clients keep state, each lives on one
worker, so a round's sample can fall unevenly):
  A  2 workers x 1 CPU     (the suite's base: one worker per core)
  B  3 workers x 0.5 CPU
  C  5 workers x 0.4 CPU   (one worker per sampled client)
Per-round seconds are the server's clock (rounds.jsonl); the last round also fine-tunes and evaluates all 20
clients. A full run is projected as start-up + (R - 1) training rounds + the evaluated round, R = the suite's 20;
the ratios are what matters.

    .venv/bin/python benchmarks/partial_rounds.py              # 4 rounds, 1 rep: ~10 min
    .venv/bin/python benchmarks/partial_rounds.py --rounds 6 --reps 2
"""
from __future__ import annotations

import argparse

from _common import log, machine, measured, median, parse, run_fedsim, save, smoke_sized
from fedsim.reproduce import PAPERS
from fedsim.reproduce.runner import run_trees

SETTINGS = {
    "2 workers x 1 CPU": {"workers": 2, "cpus_per_worker": 1.0},
    "3 workers x 0.5 CPU": {"workers": 3, "cpus_per_worker": 0.5},
    "5 workers x 0.4 CPU": {"workers": 5, "cpus_per_worker": 0.4},
}
RUNS = ("fedbabu", "fedper")  # the suite's run keys measured


def tree(key: str, rounds: int, engine: dict) -> dict:
    """The suite's CPU run ``key`` cut to ``rounds`` (the last one evaluated), with ``engine``'s worker settings."""
    run = run_trees(PAPERS["fedbabu"], "cpu")[key]
    run.update(name=f"bench-partial-{key}", seed=0, out_dir="/tmp/fedsim-bench-runs")
    run["train"].update(rounds=rounds, eval_every=rounds)
    run["engine"].update(engine)
    return smoke_sized(run)


def projected(result: dict, suite_rounds: int) -> float:
    """Seconds of a full suite run: start-up + (R - 1) median training rounds + the evaluated round."""
    rounds = result["round_s"]
    startup = result["end_to_end_s"] - sum(rounds)
    return startup + (suite_rounds - 1) * median(rounds[:-1]) + rounds[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    args = parse(ap, rounds=2, reps=1)
    suite_rounds = run_trees(PAPERS["fedbabu"], "cpu")["fedbabu"]["train"]["rounds"]

    runs: dict[tuple[str, str], list[dict]] = {(k, s): [] for k in RUNS for s in SETTINGS}
    for rep in range(args.reps):
        for key in RUNS:
            for label, engine in SETTINGS.items():
                r = measured(run_fedsim, tree(key, args.rounds, engine))
                runs[key, label].append(r)
                log(f"  rep {rep} {key} {label}: rounds {[round(s, 2) for s in r['round_s']]}, end to end "
                    f"{r['end_to_end_s']:.1f} s, others busy {r['others_cores']:.2f} cores")

    print(f"\nfedsim reproduce fedbabu --scale cpu runs, {args.rounds} rounds x {args.reps} reps (5 of 20 clients a "
          f"round); seconds, medians")
    print(f"{'run':<9}{'setting':<22}{'train round':>12}{'eval round':>11}{'start-up':>10}"
          f"{f'{suite_rounds}-round run':>15}{'vs 2x1':>8}{'others busy':>13}")
    full = {run: median([projected(r, suite_rounds) for r in rs]) for run, rs in runs.items()}
    for key in RUNS:
        base = full[key, "2 workers x 1 CPU"]
        for label in SETTINGS:
            rs = runs[key, label]
            print(f"{key:<9}{label:<22}{median([s for r in rs for s in r['round_s'][:-1]]):>12.2f}"
                  f"{median([r['round_s'][-1] for r in rs]):>11.2f}"
                  f"{median([r['end_to_end_s'] - sum(r['round_s']) for r in rs]):>10.1f}"
                  f"{full[key, label]:>15.1f}{full[key, label] / base:>8.2f}"
                  f"{median([r['others_cores'] for r in rs]):>13.2f}")
    for key in RUNS:
        for label in list(SETTINGS)[1:]:
            print(f"RATIO {key} {suite_rounds}-round run, ({label}) / (2 workers x 1 CPU): "
                  f"{full[key, label] / full[key, '2 workers x 1 CPU']:.2f}")
    path = save("partial_rounds", {"args": vars(args), "machine": machine(),
                                   "runs": {f"{k} | {s}": v for (k, s), v in runs.items()}})
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
