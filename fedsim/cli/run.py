"""``fedsim run CONFIG.yaml [key=value ...]``: run a configured simulation (or each of its sweep variants, one
after another), or resume one; ``--dry-run`` estimates the work instead."""
from __future__ import annotations

import argparse

from fedsim.cli.interrupts import interrupts_named
from fedsim.config import RunConfig, load_tree, refuse_defaults_only
from fedsim.core.protocol import ACCURACIES
from fedsim.errors import ConfigError
from fedsim.metrics.summary import times_to_accuracy
from fedsim.plugins import refuse_missing_modules
from fedsim.sweep.expand import expand_sweep


def comparison_table(results: list) -> str:
    """Initial accuracy (the model each client holds) and, where measured, personalized accuracy."""
    def pct(stats: dict | None, key: str) -> str:
        return f"{100 * stats[key]:.2f}" if stats else "-"

    lines = [f"{'run':<30} {'initial mean':>12} {'std':>6} {'min':>6} {'personalized':>12} {'std':>6} {'min':>6} "
             f"{'wall s':>7}", "-" * 94]
    for r in results:
        a, p = r.summary["acc"], r.summary.get("acc_personalized")
        lines.append(f"{r.name:<30} {pct(a, 'mean'):>12} {pct(a, 'std'):>6} {pct(a, 'min'):>6} {pct(p, 'mean'):>12} "
                     f"{pct(p, 'std'):>6} {pct(p, 'min'):>6} {r.summary['wall_seconds']:>7.1f}")
    return "\n".join(lines)


def summary_line(name: str, summary: dict, run_dir: object) -> str:
    """A finished run in one line: the accuracy its method's protocol reports (summary.json's ``reported``: FedBABU's
    fine-tuned one), and the simulated time to each system.target_accuracy."""
    key = summary.get("reported", "acc")
    acc = summary[key]
    line = (f"{name}: mean client accuracy {100 * acc['mean']:.2f}% {ACCURACIES[key]} (std {100 * acc['std']:.2f}, "
            f"min {100 * acc['min']:.2f}) -> {run_dir}")
    reached = [f"{100 * target:g}% {ACCURACIES.get(kind, kind)} "
               + (f"at {seconds:.1f} s" if seconds is not None else "never reached")
               for kind, target, seconds in times_to_accuracy(summary.get("system", {}))]
    return line + (f"\n  simulated time to accuracy: {', '.join(reached)}" if reached else "")


def refuse_bad_partitions(configs: list[RunConfig]) -> None:
    """Each run's data loaded and its partition drawn before torch and Ray load (5-10 s, profiled): a split the data
    cannot make (``classes`` with k above the classes present) is refused in a second. The run draws it again as
    it starts: measured, the second load and draw take 0.02 s for the quickstart's cached CIFAR-10, 0.3-0.7 s for
    experiments/shakespeare.yaml (parsed from its tarball each time). The data layer is imported here, not above:
    a config refused by its settings alone waits for none of it (numpy, PIL)."""
    from fedsim.data import load_run_data, run_partition

    for cfg in configs:
        run_partition(cfg.data, cfg.seed, load_run_data(cfg.data, cfg.seed))


def run_command(args: argparse.Namespace) -> int:
    if args.resume:
        from fedsim.engine.runfolder_checks import load_run_config

        overrides = ([args.config] if args.config else []) + args.overrides
        configs, resume = [load_run_config(args.resume, overrides, args.trust_plugins)], True
    elif args.config:
        tree = load_tree(args.config, args.overrides)
        configs, resume = expand_sweep(tree), False
        refuse_defaults_only(args.config, tree)
    else:
        raise ConfigError("fedsim run: give a CONFIG.yaml, or --resume RUN_DIR")
    for cfg in configs:  # before torch and Lightning load: a missing module is a typo too
        refuse_missing_modules(cfg.model_dump())
    if not resume:  # a resumed run trains over its folder's own partition, checked as it opens
        refuse_bad_partitions(configs)
    if args.dry_run:
        from fedsim.client.rehearsal import rehearse, throughput
        from fedsim.engine.estimate import dry_run

        return dry_run(configs, rehearse, resume, args.overwrite, throughput)
    # Imported once the config is valid: they load torch and Ray (~5 s), which a typo should not wait for.
    from fedsim.cli.progress import ProgressBar
    from fedsim.simulate import run

    if len(configs) > 1:  # every variant checked before the first trains (each run checks itself again as it starts)
        from fedsim.client.rehearsal import rehearse
        from fedsim.engine.estimate import checked_plan

        for cfg in configs:
            checked_plan(cfg, rehearse, resume, args.overwrite)

    results = []
    for cfg in configs:
        with interrupts_named(cfg):
            result = run(cfg, overwrite=args.overwrite, resume=resume, callbacks=[ProgressBar(args.quiet)])
        results.append(result)
        print(summary_line(cfg.name, result.summary, result.run_dir))
        if "sync" in result.summary.get("wandb", {}):
            print(f"  W&B run saved offline; {result.summary['wandb']['sync']}")
    print(comparison_table(results))
    return 0
