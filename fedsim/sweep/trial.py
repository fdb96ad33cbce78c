"""One Ray Tune trial: one fedsim run, in the placement group Tune reserved for it (one bundle per worker).

The trial reports each evaluated round to Tune under the dashboard's names (``fedsim.metrics.series``), so a
scheduler (ASHA) compares what the user sees in W&B; a resumed run first replays the rounds before its
checkpoint from ``rounds.jsonl``, and a run that is already done replays all of them, so the scheduler sees
every trial's whole history whatever the sweep's process went through."""
from __future__ import annotations

import os
from dataclasses import dataclass

from fedsim import storage
from fedsim.config import RunConfig
from fedsim.core import runfiles
from fedsim.core.results import read_results
from fedsim.engine.driver import Callback, Run
from fedsim.errors import ConfigError, DataError, RunFailed
from fedsim.metrics.logger import round_row
from fedsim.metrics.series import evaluated, fairness, round_metrics
from fedsim.sweep.runs import finished_summary

FINISHED = "finished"  # the key of a trial's last result when its run is complete


@dataclass(frozen=True)
class TrialRun:
    """A run of the sweep and what its trial does: run it new, resume it, run it again over a folder whose
    settings changed (overwrite), or replay a folder that is done (finished, or stopped by the scheduler)."""
    config: RunConfig
    action: str
    user_dir: str  # where the user ran the sweep from: the run's other relative paths (data.root, ...) start there


class TrialFailed(Exception):
    """A trial's run stopped on bad input or a run-time failure: its one-line cause, for the sweep's table."""


def report(metrics: dict) -> None:
    from ray import tune

    tune.report(metrics)


class TuneReporter(Callback):
    """Each evaluated round to Tune; on resume, the rounds before the checkpoint first (from rounds.jsonl). The last
    round is reported once the run is complete (``report_final``): a scheduler that stops a trial at its last
    round (ASHA at max_t) then never cuts a run short of its summary."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.last: dict = {}  # the last evaluated round

    def on_run_start(self, run: Run, done: int) -> None:
        self.replay([row for row in read_results(run.run_dir / runfiles.ROUNDS) if row["round"] <= done])

    def on_round_end(self, run: Run, result) -> None:
        self.replay([round_row(result)])

    def replay(self, rows: list[dict]) -> None:
        for row in filter(evaluated, rows):
            self.last = round_metrics(row)
            if row["round"] < self.rounds:
                report(self.last)

    def report_final(self, summary: dict) -> None:
        """The last round with the final statistics (``final/``, as W&B's summary) and the mark of a run that is
        complete: a trial whose last result lacks it was stopped by the scheduler."""
        final = {name.replace("fairness/", "final/", 1): value for name, value in fairness(summary).items()}
        report({**self.last, **final, FINISHED: True})


def train(params: dict, runs: dict[str, TrialRun]) -> None:
    """Tune's function trainable: ``params["run"]`` names the run."""
    import ray

    from fedsim.simulate import run

    item = runs[params["run"]]
    os.environ[storage.USER_DIR_ENV] = item.user_dir  # Tune runs the trial in a folder of its own
    reporter = TuneReporter(item.config.train.rounds)
    if item.action == "replay":
        _replay_folder(item.config, reporter)
        return
    try:
        result = run(item.config, overwrite=item.action == "overwrite", resume=item.action == "resume",
                     callbacks=[reporter], reserved=ray.util.get_current_placement_group())
    except (ConfigError, DataError, RunFailed, OSError, ValueError) as err:
        raise TrialFailed(str(err).splitlines()[0]) from None
    reporter.report_final(result.summary)


def _replay_folder(cfg: RunConfig, reporter: TuneReporter) -> None:
    """The folder's rounds to Tune; then, only where its summary records the config's rounds, the mark of a run that
    is complete (a trial without it is listed as stopped, never as finished)."""
    with storage.local_folder(storage.join(cfg.out_dir, cfg.name), skip=runfiles.CHECKPOINTS) as folder:
        reporter.replay(read_results(folder / runfiles.ROUNDS))
    summary = finished_summary(cfg)
    if summary is not None:
        reporter.report_final(summary)
