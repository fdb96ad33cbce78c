"""The progress bar of ``fedsim run``: a callback of the driver loop."""
from __future__ import annotations

from typing import Never

from tqdm import tqdm

from fedsim.core.protocol import RoundResult
from fedsim.engine.driver import Callback, Run


class ProgressBar(Callback):
    """A tqdm bar per run, made once the inputs are validated and training begins (so an error is never mixed
    into a bar), showing the clients' mean and worst accuracy as evaluation rounds come."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.bar: tqdm[Never] | None = None  # a bar that iterates over nothing: tqdm's stub types it tqdm[Never]

    @property
    def running_bar(self) -> tqdm[Never]:
        """The run's bar: on_run_start makes it before any other hook updates it."""
        assert self.bar is not None, "ProgressBar: a hook ran before on_run_start"
        return self.bar

    def on_run_start(self, run: Run, done: int) -> None:
        cfg = run.plan.cfg
        self.bar = tqdm(total=cfg.train.rounds, initial=done, desc=cfg.name, unit="round", disable=self.quiet,
                        dynamic_ncols=True)

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        accuracies = [r["acc"] for r in result.records]
        if accuracies:
            self.running_bar.set_postfix(mean=f"{100 * sum(accuracies) / len(accuracies):.1f}%",
                                         min=f"{100 * min(accuracies):.1f}%")
        self.running_bar.update(1)

    def on_rollback(self, run: Run, to_round: int) -> None:
        self.running_bar.n = to_round  # the rounds since the last checkpoint are redone
        self.running_bar.refresh()

    def on_run_end(self, run: Run, error: BaseException | None) -> None:
        if self.bar is not None:
            self.bar.close()
