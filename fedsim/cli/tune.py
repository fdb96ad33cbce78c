"""``fedsim tune CONFIG.yaml``: every method of the config's ``tune`` section searched with the same budget, chosen
on validation, its choice run at the final seeds; ``--dry-run`` prints the runs it would train and the budget."""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from fedsim.cli.interrupts import interrupts_continued
from fedsim.config import load_tree, refuse_defaults_only
from fedsim.errors import TuningIncomplete

if TYPE_CHECKING:  # the sweep machinery is imported only by a command that tunes
    from fedsim.sweep.tune import TunePlan


def tune_command(args: argparse.Namespace) -> int:
    from fedsim.sweep.tune import plan_tuning, results_markdown, run_tuning

    tree = load_tree(args.config, args.overrides)
    plan = plan_tuning(tree)
    refuse_defaults_only(args.config, tree)
    if args.dry_run:
        print(dry_run_text(plan))
        return 0
    command = shlex.join(["fedsim", "tune", args.config, *args.overrides])
    try:
        with interrupts_continued(command):
            table = run_tuning(plan, args.max_concurrent, overwrite=args.overwrite, quiet=args.quiet)
    except TuningIncomplete as err:
        print(f"fedsim: error: tune: {err}; `{command}` continues (finished runs are not retrained)", file=sys.stderr)
        return 3
    print(results_markdown(plan.base.name, table))
    print(f"chosen configs and the table: {plan.folder}")
    short = [row["method"] for row in table["methods"] if row["final_runs"] < plan.tune.final_seeds]
    if short:
        print(f"fedsim: error: tune: final runs of {', '.join(short)} failed (causes above); `{command}` runs them "
              "again", file=sys.stderr)
        return 3
    return 0


def dry_run_text(plan: TunePlan) -> str:
    """The count of runs (search + final), the budget, how many search runs are done and each method's space."""
    from fedsim.sweep import search as design
    from fedsim.sweep.runs import status
    from fedsim.sweep.tune import space_text

    first = len(plan.search_runs)
    # Stage 2's count does not depend on which stage-1 trial is chosen (its own draws are apart from the shared ones),
    # so the first trial stands in for the choice.
    second = {m.method: len(design.own_trials(plan.base.seed, m.method, m.own, m.trials[0], plan.tune.own_trials))
              for m in plan.methods}
    own = len(plan.tune.seeds) * sum(second.values())
    final = len(plan.methods) * plan.tune.final_seeds
    done = sum(status(cfg) == "finished" for cfg in plan.search_runs)
    lines = [f"{first + own + final} runs: {first} stage-1 + {own} stage-2 search + {final} final "
             f"({len(plan.methods)} methods)", f"budget: {plan.budget()}",
             f"stage-1 runs finished: {done} of {first} (a rerun trains only the rest)"]
    if plan.tune.space:
        lines.append(f"shared space: {space_text(plan.tune.space)}")
    lines += [f"{m.method}: {m.first} stage-1 trials; own space: {space_text(m.own) or 'none (stage 2 refines the step)'}"
              for m in plan.methods]
    return "\n".join([*lines, time_text(plan, second)])


def time_text(plan: TunePlan, second: dict[str, int]) -> str:
    """The tuning's time one run after another: each method's first trial timed here (a few of its steps), its
    search runs at that time and its finals at that rate over the first trial's settings run for tune.final_rounds
    (the trials' settings differ, the work barely: an estimate, said as one). ``second``: each method's stage-2
    trials."""
    from fedsim.client.rehearsal import throughput
    from fedsim.engine.estimate import duration, estimate, sample_steps_at

    total = 0.0
    for m in plan.methods:
        e = estimate(m.runs[0][0], overwrite=True, timer=throughput)  # its work only: statuses are counted above
        if e.seconds is None:
            return "time: not estimated (" + ("its workers train on GPUs, which a dry run does not time)"
                                              if e.gpus_per_worker else "a method's first trial had nothing to time)")
        searched = (m.first + second[m.method]) * len(plan.tune.seeds)
        final = sample_steps_at(m.runs[0][0], plan.final_rounds) / (e.train_sample_steps + e.finetune_sample_steps)
        total += e.seconds * (searched + plan.tune.final_seeds * final)
    return (f"time: about {duration(total)} one run after another, from each method's first trial timed here (a few "
            "of its steps); Ray's start-up, scoring and aggregation come on top, and runs at once take less")
