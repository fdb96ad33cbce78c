"""The ``fedsim`` command line: its argument parser, and the dispatch to one module per subcommand (``run``,
``sweep``, ``tune``, ``reproduce``, ``report``, ``export``; ``algorithms`` prints the method catalog) with the exit
code of what happened.

Exit codes: 0 success; 2 bad input (one line naming the field or file and the fix; nothing was changed);
3 the run failed at run time (one line with the cause and the exact ``--resume`` command that continues it), or Ray
did not start within its bounded wait (one line naming what it waited for);
4 the user's own code (model.client, a callback) raised once the run was under way (one line with its error, what
the run folder holds, and the ``--resume`` command that continues it after the fix);
130 / 143 interrupted by Ctrl-C / SIGTERM (one line with the ``--resume`` command, or saying that nothing was
written; the run keeps its checkpoints, and no process of it is left)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import NoReturn

from fedsim import __version__
from fedsim.cli.export import export_command
from fedsim.cli.interrupts import Interrupted, Terminated, raise_terminated
from fedsim.cli.report import report_command
from fedsim.cli.reproduce import BOARD_DEFAULT, KEPT_DEFAULT, RUNS_DEFAULT, reproduce_command
from fedsim.cli.run import run_command
from fedsim.cli.sweep import sweep_command
from fedsim.cli.tune import tune_command
from fedsim.errors import ConfigError, DataError, RayUnavailable, RunFailed, UserCodeFailed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsim", description="Personalized federated learning simulator")
    parser.add_argument("--version", action="version", version=f"fedsim {__version__}")
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
    _tune_parser(sub)
    _reproduce_parser(sub)
    _export_parser(sub)
    algorithms = sub.add_parser("algorithms", help="every method with its parameters and what it does")
    algorithms.add_argument("--markdown", action="store_true", help="the table of docs/algorithms.md")
    return parser


def _sweep_parser(sub) -> None:
    sweep = sub.add_parser("sweep", help="run a config's sweep variants (and seeds) at once as Ray Tune trials")
    sweep.add_argument("config", help="YAML file with a sweep: section, e.g. experiments/quickstart.yaml")
    sweep.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every variant")
    sweep.add_argument("--max-concurrent", type=_positive, metavar="N",
                       help="at most N trials at once (default: as many as the cluster has room for)")
    sweep.add_argument("--dry-run", action="store_true", help="validate, list each variant with its status and "
                       "resources and the metrics a scheduler can use; starts no Ray")
    _shared_run_flags(sweep, "trial")


def _shared_run_flags(parser: argparse.ArgumentParser, unit: str) -> None:
    """--overwrite and --quiet, which every command that trains takes (run's own say "run" where these say trial)."""
    parser.add_argument("--overwrite", action="store_true", help=f"train every {unit} anew, replacing its run folder "
                        "(default: a finished one is kept and replayed, an interrupted one resumed)")
    parser.add_argument("--quiet", action="store_true", help=f"one line per {unit}, as it ends")


def _export_parser(sub) -> None:
    export = sub.add_parser("export", help="each client's complete model (shared and personal parts) from a run's "
                            "checkpoint: a state_dict file and a Lightning checkpoint per client")
    export.add_argument("run", help="the run folder (or its URI), e.g. runs/quickstart-fedper")
    export.add_argument("overrides", nargs="*", help="the plug-ins the run's config names, as run --resume takes them "
                        "(e.g. model.client=my_module:MyModule): trusts that code alone")
    export.add_argument("--round", type=_positive, metavar="N", help="the round whose checkpoint to export (one the run "
                        "keeps; default: the newest)")
    export.add_argument("--clients", type=int, nargs="+", metavar="C", help="these clients (default: every client)")
    export.add_argument("--fine-tuned", action="store_true", help="the model the protocol scores as personalized: "
                        "fine-tuned (or personalized by the method's own update) as evaluation does, from the run's seed")
    export.add_argument("--out", metavar="DIR", help="where the files go (default: RUN/export/round-NNNN[-fine-tuned])")
    export.add_argument("--trust-plugins", action="store_true", help="import the code (plug-in strings) the run "
                        "folder's config names, its LightningModule included; without it, a run that names any is refused")


def _tune_parser(sub) -> None:
    tune = sub.add_parser("tune", help="tune every method of a config's tune: section with the same budget, choose on "
                          "validation, run the choices at the final seeds")
    tune.add_argument("config", help="YAML file with a tune: section and data.validation")
    tune.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run")
    tune.add_argument("--max-concurrent", type=_positive, metavar="N",
                      help="at most N trials at once (default: as many as the cluster has room for)")
    tune.add_argument("--dry-run", action="store_true", help="validate, print the count of runs (search + final), "
                      "the budget and each method's search space; starts no Ray")
    _shared_run_flags(tune, "run")


def _reproduce_parser(sub) -> None:
    from fedsim.reproduce import PAPERS

    rep = sub.add_parser("reproduce", help="run (or resume) every run behind a paper's claims and write REPRODUCTION.md; "
                         "or (leaderboard) every personalized method on two CIFAR-100 settings, docs/leaderboard.md; "
                         "or (privacy) FedAvg, FedPer, FedBABU and Ditto at epsilon 1..inf, docs/privacy.md")
    rep.add_argument("paper", choices=[*sorted(PAPERS), "leaderboard", "privacy"])
    rep.add_argument("overrides", nargs="*", help="key=value applied to every run (cuts it further; the report says so)")
    rep.add_argument("--board", default=BOARD_DEFAULT, help=f"leaderboard: which board (default {BOARD_DEFAULT}: "
                     "every method on two CIFAR-100 settings; shakespeare: text clients, docs/leaderboard-shakespeare.md; "
                     "speakers: MiniLM's LoRA adapters, docs/leaderboard-speakers.md)")
    rep.add_argument("--scale", choices=("cpu", "paper"), default="cpu",
                     help="cpu: settings cut to run on a laptop (default); paper: exactly as the paper states")
    rep.add_argument("--seeds", type=_positive, help="at most N seeds: each claim runs the seeds it fixes (0..n-1, "
                     "5 unless it says otherwise) and N caps them, which leaves a capped claim inconclusive "
                     "(default: no cap); leaderboard: the chosen settings' final seeds 0..N-1 (default: its tune.final_seeds)")
    rep.add_argument("--only", metavar="CLAIM", help="run only this claim's runs, or the leaderboard's method's (the "
                     "report still covers everything)")
    rep.add_argument("--runs", default=RUNS_DEFAULT, help=f"folder of the run folders (default {RUNS_DEFAULT}); one "
                     "under the current directory is recorded relative to it, so kept runs name the same folders on "
                     "every clone")
    rep.add_argument("--report", help="the Markdown report (default REPRODUCTION.md; leaderboard: its board's page, e.g. docs/leaderboard.md; "
                     "privacy docs/privacy.md, its section between markers)")
    rep.add_argument("--figures", help="figures and per-paper results (default: reproduction/ beside the report; privacy: "
                     "images/ beside it; the leaderboard's always go to images/ beside its page)")
    rep.add_argument("--kept", default=KEPT_DEFAULT, help="each finished run's results are kept here, and put back "
                     "into --runs where that lacks them, so a suite spans machines and sessions (commit the folder; "
                     f"default {KEPT_DEFAULT})")
    rep.add_argument("--report-only", action="store_true", help="run nothing; report from the runs that exist (and "
                     "the kept ones)")
    rep.add_argument("--dry-run", action="store_true", help="validate every run's config and list what would run "
                     "(kept runs are put back into --runs first, as a run would)")
    rep.add_argument("--max-concurrent", type=_positive, metavar="N", help="run N runs at once as Ray Tune trials on "
                     "the current Ray cluster (default: one after another in this process)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


OVERRIDABLE = ("run", "sweep", "tune", "reproduce", "export")  # the commands that take key=value overrides


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
    previous = signal.signal(signal.SIGTERM, raise_terminated) if threading.current_thread() is threading.main_thread() else None
    caller_ray = _ray_connected()
    try:
        commands = {"export": export_command, "report": report_command, "reproduce": reproduce_command, "run": run_command,
                    "sweep": sweep_command, "tune": tune_command}
        return commands[args.command](args)
    except Interrupted as err:
        print(f"fedsim: {err}", file=sys.stderr)
        return err.exit_code
    except (KeyboardInterrupt, Terminated) as err:  # before a run folder was chosen
        print("fedsim: interrupted", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    except (RunFailed, RayUnavailable) as err:
        return _fail(err, 3)
    except UserCodeFailed as err:
        return _fail(err, 4)
    except (ConfigError, DataError, ValueError, OSError) as err:
        # User-facing input problems: one line naming the field and the fix, no traceback.
        where = f" ({err.filename})" if isinstance(err, OSError) and err.filename else ""
        return _fail(err, 2, where)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if not caller_ray:
            _disconnect_ray()


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
    if not _ray_connected():
        return
    from fedsim.engine.ray_start import stop_ray

    # A second Ctrl-C or SIGTERM while Ray's processes are ended (bounded: a few seconds) would escape as a
    # traceback and leave them running: held off until they are gone.
    main = threading.current_thread() is threading.main_thread()
    held = [(s, signal.signal(s, signal.SIG_IGN)) for s in (signal.SIGINT, signal.SIGTERM)] if main else []
    try:
        stop_ray()
    finally:
        for signum, handler in held:
            signal.signal(signum, handler)


def run_cli() -> NoReturn:
    """The ``fedsim`` command: exits with ``main()``'s code. A process whose start of Ray was given up while its
    thread was still inside Ray's C++ client ends without Python's finalization, which can crash beside such a
    thread (Ray's C++ destructors, its calls back into Python: ray-project/ray#37596, #47864). The likeliest cause,
    not proven, of a signalled start that once exited with SIGSEGV after its one line (tests/hostile/test_signals.py
    under load; not reproducible on demand)."""
    code = main()
    ray_start = sys.modules.get("fedsim.engine.ray_start")
    if ray_start is not None and ray_start.start_still_inside_ray():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run_cli()
