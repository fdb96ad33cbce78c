"""Command to exit: a tiny run and three refusals, as a user meets them (`fedsim run CONFIG ...` in a fresh process).

Cases, each timed as wall seconds and CPU seconds (``getrusage(RUSAGE_CHILDREN)``: the command and the descendants
reaped before it exited, so a Ray run's own processes may be counted only in part):

  tiny run    synthetic data, 2 clients, MLP, 1 round, 1 worker (`--overwrite`)
  bad setting train.rounds=-1
  bad split   data.partition={name: classes, k: 4} on 2 clients (the data shows k is too large: they hold 2 classes)
  bad module  model.client=nosuch_module:Thing (no such module on the path)

Each case runs on every engine given: `ray` and `local` (engine.backend) from this checkout, and with
`--before PATH` the fedsim of another checkout (PYTHONPATH=PATH, its default engine, Ray) as the baseline.
Repetitions are interleaved (case by case, engine by engine) and medians reported, since the 2-core machine is
shared and its load drifts; `--smoke` runs one repetition of the refusals only (seconds).

    .venv/bin/python benchmarks/startup.py --reps 3 --before ../main
    .venv/bin/python benchmarks/startup.py --smoke
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _common import REPO, machine, median, save

TINY = {"name": "startup-tiny", "seed": 0, "algorithm": "fedavg",
        "data": {"dataset": "synthetic", "partition": "natural", "num_clients": 2, "augment": False,
                 "options": {"num_clients": 2}},
        "model": {"name": "mlp", "personal_layers": 1},
        "train": {"rounds": 1, "local_epochs": 1, "batch_size": 10, "fraction": 1.0, "eval_every": 1},
        "eval": {"finetune_epochs": 0}, "engine": {"workers": 1}}
CASES = {"tiny run": ["--overwrite"], "bad setting": ["train.rounds=-1"],
         "bad split": ["data.partition={name: classes, k: 4}"], "bad module": ["model.client=nosuch_module:Thing"]}
EXPECTED_EXIT = {"tiny run": 0, "bad setting": 2, "bad split": 2, "bad module": 2}


def timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the process tree that waited on its children, exit code) of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in EXPECTED_EXIT.values():
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return wall, cpu, done.returncode


def engines(before: str | None) -> dict[str, tuple[str, list[str]]]:
    """Engine name -> (PYTHONPATH, extra overrides)."""
    found = {"ray": (str(REPO), ["engine.backend=ray"]), "local": (str(REPO), ["engine.backend=local"])}
    if before:
        found = {"before (ray)": (str(Path(before).resolve()), []), **found}
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", metavar="PATH", help="another checkout of fedsim, timed as the baseline")
    ap.add_argument("--smoke", action="store_true", help="one repetition of the refusals: a check that it runs")
    args = ap.parse_args()
    reps, cases = (1, [c for c in CASES if c != "tiny run"]) if args.smoke else (args.reps, list(CASES))
    work = Path(tempfile.mkdtemp(prefix="fedsim-startup-"))
    config = work / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "out_dir": str(work / "runs")}))
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(reps):
        for case in cases:
            for engine, (path, overrides) in engines(args.before).items():
                env = {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "disabled"}
                wall, cpu, code = timed([fedsim, "run", str(config), *overrides, *CASES[case]], env, work)
                assert code == EXPECTED_EXIT[case], (case, engine, code)
                times.setdefault((case, engine), []).append((wall, cpu))
    print(f"{'case':<13}{'engine':<14}{'reps':>5}{'wall s':>9}{'CPU s':>8}")
    for (case, engine), xs in times.items():
        print(f"{case:<13}{engine:<14}{len(xs):>5}{median([w for w, _ in xs]):>9.2f}{median([c for _, c in xs]):>8.2f}")
    path = save("startup", {"args": vars(args), "machine": machine(),
                            "times": {f"{case} | {engine}": xs for (case, engine), xs in times.items()}})
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
