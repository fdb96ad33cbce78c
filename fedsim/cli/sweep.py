"""``fedsim sweep CONFIG.yaml``: a config's sweep variants (and seeds) run at once as Ray Tune trials;
``--dry-run`` lists each variant with its status and resources instead."""
from __future__ import annotations

import argparse
import shlex
import sys

from fedsim.cli.interrupts import interrupts_continued
from fedsim.config import load_tree, refuse_defaults_only
from fedsim.sweep.expand import expand_sweep


def sweep_command(args: argparse.Namespace) -> int:
    from fedsim.config import validate

    tree = load_tree(args.config, args.overrides)
    configs = expand_sweep(tree)
    refuse_defaults_only(args.config, tree)
    base = validate(tree)  # the config as written: its name and search section (a variant carries neither)
    from fedsim.sweep.executor import Sweep

    sweep = Sweep(base.name, configs, base.search)
    sweep.check()  # what a run refuses, --dry-run refuses too
    if args.dry_run:
        return _sweep_dry_run(configs, base)
    from fedsim.sweep.executor import results_table, run_sweep, write_results

    command = shlex.join(["fedsim", "sweep", args.config, *args.overrides])
    with interrupts_continued(command):
        outcomes = run_sweep(sweep, args.max_concurrent, overwrite=args.overwrite, quiet=args.quiet)
    print(results_table(outcomes))
    print(write_results(sweep, outcomes))
    failed = [o.name for o in outcomes if o.state == "failed"]
    if failed:
        print(f"fedsim: error: {len(failed)} of {len(outcomes)} trials failed ({', '.join(failed)}; causes above); "
              f"fix them and run `{command}` again (finished trials are not retrained)", file=sys.stderr)
        return 3
    return 0


def _sweep_dry_run(configs: list, base) -> int:
    from fedsim.client.rehearsal import rehearse, throughput
    from fedsim.engine.estimate import estimate, time_line, total_time_line
    from fedsim.metrics.series import metric_names, series_mode
    from fedsim.sweep.executor import trial_bundles
    from fedsim.sweep.runs import status

    print(f"{len(configs)} trials; scheduler {base.search.scheduler}"
          + (f" on {base.search.metric} ({base.search.mode or series_mode(base.search.metric or '')})"
             if base.search.scheduler == "asha" else ""))
    estimates = []
    for cfg in configs:
        state = status(cfg)
        # What the trial's run would refuse before its first round (it resumes a resumable run, replaces a changed one).
        e = estimate(cfg, rehearse, state == "resumable", state in ("changed", "finished"), throughput)
        bundles = trial_bundles(cfg)
        each = ", ".join(f"{v:g} {k}" for k, v in bundles[0].items())
        print(f"{cfg.name}: {state}; {len(bundles)} workers x ({each}); {time_line(e)}")
        estimates.append(e if state != "finished" else None)
    print(total_time_line([e for e in estimates if e is not None]))
    print("per-round metrics a scheduler can compare (search.metric): " + ", ".join(metric_names(configs[0]))
          + ", and what your module logs with self.log as NAME/STATISTIC (e.g. val_loss/mean)")
    return 0
