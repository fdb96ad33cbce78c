"""``fedsim reproduce PAPER`` (or ``leaderboard``): run or resume the runs behind a paper's claims (the
leaderboard's methods), keep each finished run's results, and write the report; ``--dry-run`` estimates the work
and the time left instead."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from fedsim.config import RunConfig
    from fedsim.reproduce import leaderboard
    from fedsim.reproduce.claims import Paper
    from fedsim.reproduce.runner import PlannedRun

RUNS_DEFAULT = "runs/reproduce"
KEPT_DEFAULT = "reproduction/runs"
BOARD_DEFAULT = "cifar100"  # `reproduce leaderboard`'s board (fedsim.reproduce.leaderboard.BOARDS)


def reproduce_command(args: argparse.Namespace) -> int:
    """A paper's claims (or fedsim's privacy question): plan every run they read, run what is left, keep each
    finished run, then the verdicts and the paper's page; the leaderboard has its own command."""
    from fedsim import storage
    from fedsim.reproduce.restore import restore_kept
    from fedsim.reproduce.runner import execute, folder_keys, keep_finished, plan, run_trees
    from fedsim.reproduce.verdicts import evaluate

    if args.paper == "leaderboard":
        if args.figures:
            raise ConfigError("--figures: the leaderboard draws its figure into images/ beside its page; choose the "
                              "page with --report and leave --figures out")
        return _leaderboard_command(args)
    if args.board != BOARD_DEFAULT:
        raise ConfigError(f"--board: only the leaderboard has boards, not {args.paper}; leave --board out")
    paper = claim_papers()[args.paper]
    claims = (paper.claim(args.only),) if args.only else paper.claims
    runs_dir = storage.portable(args.runs)  # what every run's config.yaml stores (out_dir, model.init_from)
    planned = plan(paper, claims, args.scale, args.seeds, runs_dir, args.overrides)  # validates every config first
    kept = kept_folder(args.kept)
    everything = planned if args.only is None else plan(paper, paper.claims, args.scale, args.seeds, runs_dir,
                                                        args.overrides)
    _restored(restore_kept(everything, kept), kept)
    if args.dry_run:
        return _reproduce_dry_run(planned, args.seeds)
    if not args.report_only:
        execute(planned, max_concurrent=args.max_concurrent, name=f"{args.paper}-{args.scale}", kept=kept)
    for item in planned:  # runs another process finished, or that finished before they were kept as they finish
        keep_finished(item, planned, kept)
    folders = folder_keys(run_trees(paper, args.scale, args.overrides))
    results = evaluate(paper, paper.claims, args.scale, args.seeds, runs_dir, _command(args), folders)
    for path in PAGES[paper.page](results, args, Suite(paper, everything, runs_dir, folders)):
        print(path)
    for claim in results["claims"]:
        print(f"{claim['id']}: {claim['verdict']}")
    return 0


def claim_papers() -> dict[str, "Paper"]:
    """Every paper whose claims ``fedsim reproduce`` decides: those of ``fedsim/reproduce/papers/``, and fedsim's
    own privacy question."""
    from fedsim.reproduce import PAPERS, privacy

    return {**PAPERS, privacy.PAPER.key: privacy.PAPER}


@dataclass(frozen=True)
class Suite:
    """A paper's planned runs and where they are: what its verdicts were read from, for a page that reads more."""
    paper: "Paper"
    planned: list["PlannedRun"]
    runs_dir: Path
    folders: dict[str, str]


def _write_reproduction(results: dict, args: argparse.Namespace, suite: Suite) -> list[Path]:
    """REPRODUCTION.md (and README.md's headline), rendered from every paper's results under its figures folder."""
    from fedsim.reproduce.report import write_report, write_results

    report = Path(args.report or "REPRODUCTION.md").resolve()
    figures = Path(args.figures).resolve() if args.figures else report.parent / "reproduction"
    return [write_results(results, figures), *write_report(figures, report)]


def _write_privacy(results: dict, args: argparse.Namespace, suite: Suite) -> list[Path]:
    """docs/privacy.md's section and its figure of accuracy against epsilon, with each calibrated noise multiplier,
    the clip norm's proxy and how often it clipped read from the runs."""
    from fedsim.reproduce import privacy, privacy_report

    page = Path(args.report or "docs/privacy.md").resolve()
    figures = Path(args.figures).resolve() if args.figures else page.parent / "images"
    where = (suite.paper, args.scale, suite.runs_dir, suite.folders, privacy.SEEDS)
    spent = privacy_report.privacy_of_runs(*where)
    setting = next(item.config for item in suite.planned if item.key == privacy.run_key("FedAvg", privacy.TESTED))
    norms, clipped = privacy_report.proxy_norms(*where), privacy_report.clipped_share(*where)
    return privacy_report.write(results, spent, setting, page, figures, norms, clipped)


PAGES = {"reproduction": _write_reproduction, "privacy": _write_privacy}  # Paper.page -> its writer


def _leaderboard_command(args: argparse.Namespace) -> int:
    """The search's two stages, then the finals of every method whose search has ended (each planned again once the
    runs before it have run: stage 2 and the choices are read from the finished search runs), then the table from
    every run folder."""
    from fedsim import storage
    from fedsim.reproduce import leaderboard, leaderboard_table
    from fedsim.reproduce.runner import keep_finished

    runs_dir, kept = storage.portable(args.runs), kept_folder(args.kept)
    board = leaderboard.named_board(args.board)

    def planned(only: str | None) -> leaderboard.Plan:  # validates every config first
        return leaderboard.plan(args.scale, runs_dir, kept, args.overrides, only, args.seeds, board=board)

    def restored() -> leaderboard.Plan:  # kept runs put back first: a choice is read from the search's folders
        full, count = leaderboard.restored(lambda: planned(None), kept)
        _restored(count, kept)
        return full

    full = restored()
    mine = full if args.only is None else planned(args.only)
    if args.dry_run:
        return _leaderboard_dry_run(mine, leaderboard.Diverged(kept))
    if not args.report_only:
        while True:  # stage 1's runs, then stage 2's (planned once stage 1's choice can be read from its runs)
            leaderboard.complete(mine.search, kept, args.max_concurrent)
            full = restored()
            searched, mine = mine, full if args.only is None else planned(args.only)
            if len(mine.search) == len(searched.search):
                break
        leaderboard.complete(mine.finals, kept, args.max_concurrent)
    for item in mine.runs:
        keep_finished(item, mine.runs, kept)
    full = planned(None)
    table = leaderboard_table.evaluate(full, kept)
    for path in leaderboard_table.write(table, args.scale, full, _command(args),
                                        Path(args.report or board.report)):
        print(path)
    return 0


def _leaderboard_dry_run(mine: "leaderboard.Plan", diverged: "leaderboard.Diverged") -> int:
    """Each run key's work estimated once (a final's seeds are the same work), every planned run's status and the
    time left at the measured rate; then the finals still waiting for their search, estimated at the mean work of
    that method's trials (their settings are not chosen yet). A run recorded as diverged under its present settings
    is listed as such and is not left: the leaderboard never retries it."""
    from fedsim.engine.estimate import estimate, sample_steps_at
    from fedsim.sweep.runs import status

    work: dict[str, int] = {}
    for item in mine.runs:
        if item.key not in work:
            e = estimate(item.config, overwrite=True)  # work only: the run's own status is listed below
            work[item.key] = e.train_sample_steps + e.finetune_sample_steps
    states = [(item, diverged.status(item, status(item.config))) for item in mine.runs]
    for item, state in states:
        print(f"{item.config.name}: {state}")
    counts = {state: sum(s == state for _, s in states) for state in dict.fromkeys(s for _, s in states)}
    print(f"planned now: {len(mine.search)} search runs, {len(mine.finals)} final runs "
          f"({', '.join(f'{n} {state}' for state, n in counts.items()) or 'none'}); "
          f"{sum(work[item.key] for item in mine.runs):,} sample-steps (training and fine-tuning)")
    waiting = mine.waiting()
    if waiting:
        steps = sum(mine.tune.final_seeds * sum(sample_steps_at(t[0].config, mine.final_rounds) for t in s.runs)
                    / len(s.runs) for s in waiting)
        print(f"waiting for their search: {len(waiting) * mine.tune.final_seeds} final runs ({len(waiting)} method x "
              f"setting searches not ended), about {steps:,.0f} sample-steps (each at its method's mean trial, "
              f"run for the finals' {mine.final_rounds} rounds)")
    left = [(item, state) for item, state in states if state != diverged.STATUS]
    first = next((item.config for item, state in left if state != "finished"), None)
    print(_time_left(left, work, lambda: _timed_rate(first)))
    print(f"budget: {mine.budget()}")
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command that regenerates the page, as the page names it."""
    board = [f"--board {args.board}"] if args.paper == "leaderboard" and args.board != BOARD_DEFAULT else []
    return " ".join([f"fedsim reproduce {args.paper}", *board, f"--scale {args.scale}",
                     *([f"--seeds {args.seeds}"] if args.seeds else []), *_folder_options(args), *args.overrides])


def _folder_options(args: argparse.Namespace) -> list[str]:
    """The command's --runs and --kept where they are not the defaults, for the command a report names."""
    return [*([f"--runs {args.runs}"] if args.runs != RUNS_DEFAULT else []),
            *([f"--kept {args.kept}"] if args.kept != KEPT_DEFAULT else [])]


def kept_folder(given: str) -> Path:
    """``--kept`` as given; left at its default where the working folder has no such folder, the kept runs of the
    fedsim clone this package is imported from (run from another folder, the suite is still the README's); with
    neither, says where it looked and which flag points at them."""
    here = Path(given).resolve()
    if given != KEPT_DEFAULT or here.is_dir():
        return here
    import fedsim

    clone = Path(fedsim.__file__).resolve().parents[1] / KEPT_DEFAULT
    if clone.is_dir():
        print(f"kept runs: {clone} (the working folder has no {KEPT_DEFAULT}; --kept FOLDER names another)")
        return clone
    print(f"kept runs: none found at {here} or {clone}; every run counts as left. Give --kept FOLDER (a fedsim "
          f"clone's {KEPT_DEFAULT}) to reuse its finished runs", file=sys.stderr)
    return here


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
    first_left: tuple[RunConfig | None, bool, bool] = (None, False, True)  # the first run left, to time its steps
    after, key_of = [], {p.config.name: p.key for p in planned}  # runs that start from another run's model
    for item in (p for p in planned if p.seed == 0):
        config = item.estimable()
        if item.needs:
            after.append(f"{item.key} after {', '.join(key_of[dep.name] for dep in item.needs)}")
        state = status(item.config)  # checked as its run would take it: a kept run is replayed, not started anew
        resume, overwrite = state == "resumable", state in ("changed", "finished")
        e = estimate(config, resume=resume, overwrite=overwrite)
        if first_left[0] is None and state != "finished":
            first_left = (config, resume, overwrite)
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
    print(_time_left(states, work, lambda: _timed_rate(*first_left)))
    return 0


def _time_left(states: list[tuple], work: dict[str, int], timed: Callable[[], float | None]) -> str:
    """What is left, timed at the rate the finished runs measured here (an extrapolation, said as one): by their
    rounds' wall time, under whatever load they met, and, from the runs that recorded it, by their rounds' CPU
    time, which other load does not raise (so it reads as hours of one busy core). With no finished run to
    measure, at the rate ``timed()`` gives: a few steps of the first run left, timed on this machine."""
    from fedsim.reproduce.runner import run_cpu_seconds, run_seconds

    finished = [item for item, state in states if state == "finished"]
    left = sum(work[item.key] for item, state in states if state != "finished")
    seconds = sum(run_seconds(item.folder) for item in finished)
    line = f"left: {len(states) - len(finished)} runs, {left:,} sample-steps"
    if not left:
        return line
    if not seconds:
        rate = timed()
        return line + ("" if not rate else f"; about {left / rate / 3600:.1f} h of training and fine-tuning at the "
                       f"{rate:,.0f} sample-steps/s the first run left trained at in a few steps timed here (no "
                       "finished run to measure from; Ray's start-up, scoring and aggregation come on top)")
    rate = sum(work[item.key] for item in finished) / seconds
    line += (f"; about {left / rate / 3600:.1f} h at the {rate:,.0f} sample-steps/s the {len(finished)} finished runs "
             "measured (their rounds' time)")
    # A list, not a dict by key: a run's seeds share its key, and each seed is a run of its own.
    cpu_timed = [(item.key, cpu) for item in finished if (cpu := run_cpu_seconds(item.folder))]
    if not cpu_timed:
        return line
    cpu_rate = sum(work[key] for key, _ in cpu_timed) / sum(cpu for _, cpu in cpu_timed)
    return (line + f"; about {left / cpu_rate / 3600:.1f} CPU-core hours at the {cpu_rate:,.0f} sample-steps per "
            f"CPU-second the {len(cpu_timed)} of them that recorded their CPU time measured")


def _timed_rate(config: RunConfig | None, resume: bool = False, overwrite: bool = True) -> float | None:
    """The sample-steps per second ``config``'s run trains at on this machine, its workers at once, from a few of its
    steps timed (``fedsim.client.rehearsal.throughput``); None without a config."""
    if config is None:
        return None
    from fedsim.client.rehearsal import throughput
    from fedsim.engine.estimate import estimate

    e = estimate(config, resume=resume, overwrite=overwrite, timer=throughput)
    return None if e.per_worker is None else e.per_worker * e.at_once
