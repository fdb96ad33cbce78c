"""``fedsim run CONFIG.yaml [key=value ...]`` - run a configured simulation (or each of its sweep variants, one
after another); ``fedsim sweep`` runs the variants at once as Ray Tune trials; ``report``, ``reproduce``, ``algorithms``.

Exit codes: 0 success; 2 bad input (one line naming the field or file and the fix; nothing was changed);
3 the run failed at run time (one line with the cause and the exact ``--resume`` command that continues it);
130 / 143 interrupted by Ctrl-C / SIGTERM (one line with the ``--resume`` command; the run keeps its checkpoints)."""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import threading

from fedsim.config import ConfigError, expand_sweep, load_tree, refuse_defaults_only
from fedsim.errors import DataError, RunFailed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsim", description="Personalized federated learning simulator")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a simulation from a YAML config")
    run.add_argument("config", nargs="?", help="YAML file, e.g. experiments/quickstart.yaml (omit with --resume)")
    run.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.rounds=3 engine.workers=1")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    run.add_argument("--trust-plugins", action="store_true", help="with --resume: import the code (plug-in strings) "
                     "the run folder's config names; without it, only plug-ins given on the command line are imported")
    run.add_argument("--quiet", action="store_true", help="no progress bar; one line per run")
    run.add_argument("--dry-run", action="store_true", help="validate, build the partition and model, print the "
                     "estimated work (sample-steps, traffic, resources) and exit; starts no Ray, writes no run folder")
    report = sub.add_parser("report", help="plots and a Markdown table from run folders")
    report.add_argument("runs", nargs="+", help="run folders or their URIs, e.g. runs/quickstart-fedavg s3://BUCKET/runs/quickstart-fedper")
    report.add_argument("--out", default="reports", help="output folder (default: reports/)")
    _sweep_parser(sub)
    _reproduce_parser(sub)
    algorithms = sub.add_parser("algorithms", help="every method with its parameters and what it does")
    algorithms.add_argument("--markdown", action="store_true", help="the table of docs/algorithms.md")
    return parser


RUNS_DEFAULT = "runs/reproduce"
KEPT_DEFAULT = "reproduction/runs"


def _sweep_parser(sub) -> None:
    sweep = sub.add_parser("sweep", help="run a config's sweep variants (and seeds) at once as Ray Tune trials")
    sweep.add_argument("config", help="YAML file with a sweep: section, e.g. experiments/quickstart.yaml")
    sweep.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every variant")
    sweep.add_argument("--max-concurrent", type=_positive, metavar="N",
                       help="at most N trials at once (default: as many as the cluster has room for)")
    sweep.add_argument("--dry-run", action="store_true", help="validate, list each variant with its status and "
                       "resources and the metrics a scheduler can use; starts no Ray")


def _reproduce_parser(sub) -> None:
    from fedsim.reproduce import PAPERS

    rep = sub.add_parser("reproduce", help="run (or resume) every run behind a paper's claims and write REPRODUCTION.md; "
                         "or (leaderboard) every personalized method on two CIFAR-100 settings, docs/leaderboard.md")
    rep.add_argument("paper", choices=[*sorted(PAPERS), "leaderboard"])
    rep.add_argument("overrides", nargs="*", help="key=value applied to every run (cuts it further; the report says so)")
    rep.add_argument("--scale", choices=("cpu", "paper"), default="cpu",
                     help="cpu: settings cut to run on a laptop (default); paper: exactly as the paper states")
    rep.add_argument("--seeds", type=_positive, help="at most N seeds: each claim runs the seeds it fixes (0..n-1, "
                     "5 unless it says otherwise) and N caps them, which leaves a capped claim inconclusive "
                     "(default: no cap); leaderboard: seeds 0..N-1 per run (default 5)")
    rep.add_argument("--only", metavar="CLAIM", help="run only this claim's runs, or the leaderboard's method's (the "
                     "report still covers everything)")
    rep.add_argument("--runs", default=RUNS_DEFAULT, help=f"folder of the run folders (default {RUNS_DEFAULT})")
    rep.add_argument("--report", help="the Markdown report (default REPRODUCTION.md; leaderboard docs/leaderboard.md)")
    rep.add_argument("--figures", help="figures and per-paper results (default: reproduction/ beside the report)")
    rep.add_argument("--kept", default=KEPT_DEFAULT, help="each finished run's results are kept here, and put back "
                     "into --runs where that lacks them, so a suite spans machines and sessions (commit the folder; "
                     f"default {KEPT_DEFAULT})")
    rep.add_argument("--report-only", action="store_true", help="run nothing; report from the runs that exist (and "
                     "the kept ones)")
    rep.add_argument("--dry-run", action="store_true", help="validate every run's config and list what would run")
    rep.add_argument("--max-concurrent", type=_positive, metavar="N", help="run N runs at once as Ray Tune trials on "
                     "the current Ray cluster (default: one after another in this process)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


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


def _run_command(args: argparse.Namespace) -> int:
    if args.resume:
        from fedsim.engine.runfolder import load_run_config

        overrides = ([args.config] if args.config else []) + args.overrides
        configs, resume = [load_run_config(args.resume, overrides, args.trust_plugins)], True
    elif args.config:
        tree = load_tree(args.config, args.overrides)
        configs, resume = expand_sweep(tree), False
        refuse_defaults_only(args.config, tree)
    else:
        raise ConfigError("fedsim run: give a CONFIG.yaml, or --resume RUN_DIR")
    if args.dry_run:
        from fedsim.engine.estimate import dry_run

        return dry_run(configs)
    # Imported once the config is valid: they load torch and Ray (~5 s), which a typo should not wait for.
    from fedsim.cli.progress import ProgressBar
    from fedsim.simulate import run

    results = []
    for cfg in configs:
        with interrupts_named(cfg):
            result = run(cfg, overwrite=args.overwrite, resume=resume, callbacks=[ProgressBar(args.quiet)])
        results.append(result)
        acc = result.summary["acc"]
        print(f"{cfg.name}: mean client accuracy {100 * acc['mean']:.2f}% (std {100 * acc['std']:.2f}, "
              f"min {100 * acc['min']:.2f}) -> {result.run_dir}")
        if "sync" in result.summary.get("wandb", {}):
            print(f"  W&B run saved offline; {result.summary['wandb']['sync']}")
    print(comparison_table(results))
    return 0


def _sweep_command(args: argparse.Namespace) -> int:
    from fedsim.config import validate

    tree = load_tree(args.config, args.overrides)
    configs = expand_sweep(tree)
    refuse_defaults_only(args.config, tree)
    base = validate(tree)  # the config as written: its name and search section (a variant carries neither)
    if args.dry_run:
        return _sweep_dry_run(configs, base)
    from fedsim.sweep.executor import Sweep, results_table, run_sweep, write_results

    sweep = Sweep(base.name, configs, base.search)
    outcomes = run_sweep(sweep, args.max_concurrent)
    print(results_table(outcomes))
    print(write_results(sweep, outcomes))
    failed = [o.name for o in outcomes if o.state == "failed"]
    if failed:
        command = shlex.join(["fedsim", "sweep", args.config, *args.overrides])
        print(f"fedsim: error: {len(failed)} of {len(outcomes)} trials failed ({', '.join(failed)}; causes above); "
              f"fix them and run `{command}` again (finished trials are not retrained)", file=sys.stderr)
        return 3
    return 0


def _sweep_dry_run(configs: list, base) -> int:
    from fedsim.metrics.series import metric_names
    from fedsim.sweep.executor import trial_bundles
    from fedsim.sweep.runs import status

    print(f"{len(configs)} trials; scheduler {base.search.scheduler}"
          + (f" on {base.search.metric} ({base.search.mode})" if base.search.scheduler == "asha" else ""))
    for cfg in configs:
        bundles = trial_bundles(cfg)
        each = ", ".join(f"{v:g} {k}" for k, v in bundles[0].items())
        print(f"{cfg.name}: {status(cfg)}; {len(bundles)} workers x ({each})")
    print("per-round metrics a scheduler can compare (search.metric): " + ", ".join(metric_names(configs[0])))
    return 0


def _reproduce_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedsim.reproduce import PAPERS
    from fedsim.reproduce.report import evaluate, write_report, write_results
    from fedsim.reproduce.runner import execute, folder_keys, keep_finished, plan, restore_kept, run_trees

    if args.paper == "leaderboard":
        return _leaderboard_command(args)
    args.report = args.report or "REPRODUCTION.md"
    paper = PAPERS[args.paper]
    claims = (paper.claim(args.only),) if args.only else paper.claims
    runs_dir = Path(args.runs).resolve()
    planned = plan(paper, claims, args.scale, args.seeds, runs_dir, args.overrides)  # validates every config first
    kept = Path(args.kept).resolve()
    everything = planned if args.only is None else plan(paper, paper.claims, args.scale, args.seeds, runs_dir,
                                                        args.overrides)
    _restored(restore_kept(everything, kept), kept)
    if args.dry_run:
        return _reproduce_dry_run(planned, args.seeds)
    if not args.report_only:
        execute(planned, max_concurrent=args.max_concurrent, name=f"{args.paper}-{args.scale}", kept=kept)
    for item in planned:  # runs another process finished, or that finished before they were kept as they finish
        keep_finished(item, planned, kept)
    report = Path(args.report).resolve()
    figures = Path(args.figures).resolve() if args.figures else report.parent / "reproduction"
    command = " ".join(["fedsim reproduce", args.paper, f"--scale {args.scale}",
                        *([f"--seeds {args.seeds}"] if args.seeds else []),
                        *_folder_options(args), *args.overrides])
    folders = folder_keys(run_trees(paper, args.scale, args.overrides))
    results = evaluate(paper, paper.claims, args.scale, args.seeds, runs_dir, command, folders)
    print(write_results(results, figures))
    for path in write_report(figures, report):
        print(path)
    for claim in results["claims"]:
        print(f"{claim['id']}: {claim['verdict']}")
    return 0


def _leaderboard_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedsim.reproduce import leaderboard
    from fedsim.reproduce.runner import keep_finished, restore_kept

    seeds = args.seeds or 5
    runs_dir, kept = Path(args.runs).resolve(), Path(args.kept).resolve()
    planned = leaderboard.plan(args.scale, seeds, runs_dir, args.overrides, args.only)  # validates every config first
    everything = planned if args.only is None else leaderboard.plan(args.scale, seeds, runs_dir, args.overrides)
    _restored(restore_kept(everything, kept), kept)
    if args.dry_run:
        return _reproduce_dry_run(planned, seeds)
    if not args.report_only:
        leaderboard.complete(planned, kept, args.max_concurrent)
    for item in planned:
        keep_finished(item, planned, kept)
    command = " ".join(["fedsim reproduce leaderboard", f"--scale {args.scale}", f"--seeds {seeds}",
                        *_folder_options(args), *args.overrides])
    table = leaderboard.evaluate(everything, kept)
    for path in leaderboard.write(table, args.scale, everything, command, Path(args.report or "docs/leaderboard.md")):
        print(path)
    return 0


def _folder_options(args: argparse.Namespace) -> list[str]:
    """The command's --runs and --kept where they are not the defaults, for the command a report names."""
    return [*([f"--runs {args.runs}"] if args.runs != RUNS_DEFAULT else []),
            *([f"--kept {args.kept}"] if args.kept != KEPT_DEFAULT else [])]


def _restored(count: int, kept: Path) -> None:
    if count:
        print(f"{count} finished runs put back from {kept}")


def _reproduce_dry_run(planned: list, seeds: int | None) -> int:
    """Each run of the first seed built and estimated (the other seeds are the same work), then every run's status.
    ``seeds``: the cap, or None where each claim fixes its own (the header then says the most any run gets)."""
    from fedsim.engine.estimate import estimate
    from fedsim.sweep.runs import status

    most = max((p.seed for p in planned), default=-1) + 1
    label = f"x{seeds} seeds" if seeds else f"x up to {most} seeds"
    print(f"{'run (seed 0; ' + label + ')':<44} {'model':<13} {'rounds':>6} {'sampled':>7} {'epochs':>6} "
          f"{'train sample-steps':>18} {'fine-tune':>12}")
    work = {}  # run key -> sample-steps (training and fine-tuning), the same for every seed
    after, key_of = [], {p.config.name: p.key for p in planned}  # runs that start from another run's model
    for item in (p for p in planned if p.seed == 0):
        config = item.config
        if item.needs:  # its weights are another run's, possibly not yet there: the same work from random weights
            config = config.model_copy(update={"model": config.model.model_copy(update={"init_from": None})})
            after.append(f"{item.key} after {', '.join(key_of[dep.name] for dep in item.needs)}")
        e = estimate(config)
        work[item.key] = e.train_sample_steps + e.finetune_sample_steps
        print(f"{item.config.name:<44} {e.model:<13} {e.rounds:>6} {e.sampled_per_round:>7} {e.epochs_per_round:>6} "
              f"{e.train_sample_steps:>18,} {e.finetune_sample_steps:>12,}")
    print(f"all {len(planned)} runs: {sum(work[item.key] for item in planned):,} sample-steps (training and "
          "fine-tuning)")
    if after:
        print(f"starting from another run's final model (same seed, run after it; estimated above from random "
              f"weights, the same work): {'; '.join(after)}")
    states = [(item, status(item.config)) for item in planned]
    for item, state in states:
        print(f"{item.config.name}: {state}")
    print(_time_left(states, work))
    return 0


def _time_left(states: list[tuple], work: dict[str, int]) -> str:
    """What is left, timed at the rate the finished runs measured here (an extrapolation, said as one)."""
    from fedsim.reproduce.runner import run_seconds

    finished = [item for item, state in states if state == "finished"]
    left = sum(work[item.key] for item, state in states if state != "finished")
    seconds = sum(run_seconds(item.folder) for item in finished)
    if not left or not seconds:
        return f"left: {len(states) - len(finished)} runs, {left:,} sample-steps"
    rate = sum(work[item.key] for item in finished) / seconds
    return (f"left: {len(states) - len(finished)} runs, {left:,} sample-steps; about {left / rate / 3600:.1f} h at "
            f"the {rate:,.0f} sample-steps/s the {len(finished)} finished runs measured (their rounds' time)")


def _report_command(args: argparse.Namespace) -> int:
    from contextlib import ExitStack
    from pathlib import Path

    from fedsim import storage
    from fedsim.core import runfiles
    from fedsim.metrics.report import write_report

    with ExitStack() as stack:  # run folders in a bucket are read from a temporary local copy
        runs = [stack.enter_context(storage.local_folder(run, skip=runfiles.CHECKPOINTS)) for run in args.runs]
        for path in write_report(runs, Path(args.out)):
            print(path)
    return 0


OVERRIDABLE = ("run", "sweep", "reproduce")  # the commands that take key=value overrides


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # Overrides may follow flags (`run cfg.yaml --quiet train.rounds=3`), which argparse leaves unparsed.
    args, extra = parser.parse_known_args(argv)
    stray = [e for e in extra if e.startswith("-") or "=" not in e or args.command not in OVERRIDABLE]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if args.command in OVERRIDABLE:
        args.overrides += extra
    if args.command == "algorithms":
        from fedsim.algorithms.catalog import markdown_table, text_listing

        print(markdown_table() if args.markdown else text_listing())
        return 0
    previous = signal.signal(signal.SIGTERM, _terminated) if threading.current_thread() is threading.main_thread() else None
    caller_ray = _ray_connected()
    try:
        commands = {"report": _report_command, "reproduce": _reproduce_command, "run": _run_command,
                    "sweep": _sweep_command}
        return commands[args.command](args)
    except Interrupted as err:
        print(f"fedsim: {err}", file=sys.stderr)
        return err.exit_code
    except (KeyboardInterrupt, Terminated) as err:  # before a run folder was chosen
        print("fedsim: interrupted", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    except RunFailed as err:
        return _fail(err, 3)
    except (ConfigError, DataError, ValueError, OSError) as err:
        # User-facing input problems: one line naming the field and the fix, no traceback.
        where = f" ({err.filename})" if isinstance(err, OSError) and err.filename else ""
        return _fail(err, 2, where)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if not caller_ray:
            _disconnect_ray()


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so the run unwinds as on Ctrl-C (its lock released, Ray shut down)."""


def _terminated(signum, frame) -> None:
    raise Terminated()


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM: one line with the command that continues it; exit 130 or 143."""

    def __init__(self, location: str, exit_code: int):
        self.exit_code = exit_code
        super().__init__(f"interrupted; continue with `fedsim run --resume {shlex.quote(location)}`")


@contextlib.contextmanager
def interrupts_named(cfg):
    """Ctrl-C or SIGTERM during ``cfg``'s run become one line naming how to continue it (the run keeps its
    checkpoints: the rounds since the last one are redone)."""
    from fedsim import storage

    try:
        yield
    except (KeyboardInterrupt, Terminated) as err:
        raise Interrupted(storage.join(cfg.out_dir, cfg.name), 143 if isinstance(err, Terminated) else 130) from None


def _fail(err: Exception, code: int, where: str = "") -> int:
    if os.environ.get("FEDSIM_DEBUG"):
        raise err
    print(f"fedsim: error: {err}{where}", file=sys.stderr)
    return code


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _disconnect_ray() -> None:
    """The CLI owns the Ray connection it made and ends it; one its in-process caller made (a notebook's, a test's)
    is the caller's and stays up."""
    if _ray_connected():
        sys.modules["ray"].shutdown()


if __name__ == "__main__":
    sys.exit(main())
