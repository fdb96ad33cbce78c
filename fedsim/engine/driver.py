"""The driver loop: rounds, evaluation, checkpoints and recovery, told to callbacks as they happen.

A :class:`Callback` is the hook a user adds too (like Lightning's or pfl-research's callbacks): the JSONL
logger, W&B, the progress bar and the :class:`Checkpointer` are callbacks. The loop itself only asks the
server for each round and handles what comes back: a result (told to every callback in order), a rolled-back
run (a worker was lost; everything since the last checkpoint is redone and callbacks are told to forget it),
or a divergence (the run stops).
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.core.protocol import RolledBack, RoundFailed, RoundResult
from fedsim.engine.pool import Calls
from fedsim.engine.runfolder import RunFolder
from fedsim.errors import TrainingDiverged
from fedsim.plan import RunPlan

SERVER_MARGIN_S = 60  # the driver waits on the server this much longer than the server waits on workers


class RollBack(Exception):
    """Raised by a callback (the checkpointer, when a worker dies while writing its part) to redo every round
    after ``to_round``."""

    def __init__(self, to_round: int):
        super().__init__(f"rolled back to round {to_round}")
        self.to_round = to_round


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Run:
    """What callbacks see of a run in progress."""
    plan: RunPlan
    folder: RunFolder
    resume: bool
    server: Any  # the server actor's handle
    calls: Calls  # its backend's (engine.backend): how a call's answer is waited for
    started: float = field(default_factory=time.perf_counter)
    started_at: str = field(default_factory=utc_now)  # wall clock, for summary.json
    workers: list[dict[str, Any]] = field(default_factory=list)  # each worker's device, filled when the run ends
    extras: dict[str, Any] = field(default_factory=dict)  # what callbacks add to summary.json (W&B's location)
    summary: dict[str, Any] | None = None  # summary.json's content once written (by the JSONL logger)
    callbacks: list[Callback] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.folder.local

    @property
    def timeout(self) -> float:
        # The server's own deadline for its workers comes first, and its error names the silent worker.
        return self.plan.cfg.engine.round_timeout_s + SERVER_MARGIN_S

    def call(self, method: Any) -> Any:
        """The result of a server call (``method.remote()``'s object ref)."""
        return self.calls.get(method, timeout=self.timeout)

    def save_checkpoint(self, round_idx: int) -> None:
        """Tell every callback (so that what they logged is on disk first: a published checkpoint never points
        past the metrics), then have the server and workers write the checkpoint."""
        for callback in self.callbacks:
            callback.on_save_checkpoint(self, round_idx)
        self.folder.publish()
        saved = self.call(self.server.checkpoint.remote(self.folder.checkpoints_location, round_idx))
        if isinstance(saved, RolledBack):  # a worker died while writing its part
            raise RollBack(saved.to_round)


class Callback:
    """Hooks called as a run goes; override those you need. ``run`` is the :class:`Run` in progress."""

    def on_run_start(self, run: Run, done: int) -> None:
        """Training begins after ``done`` rounds (0, or the checkpoint a resume continues from)."""

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        """A round completed; ``result.records`` holds the per-client evaluation records on evaluation rounds."""

    def on_save_checkpoint(self, run: Run, round_idx: int) -> None:
        """A checkpoint of ``round_idx`` is about to be published: make what you wrote durable."""

    def on_rollback(self, run: Run, to_round: int) -> None:
        """A worker was lost: every round after ``to_round`` is redone; forget what you have of them."""

    def on_run_end(self, run: Run, error: BaseException | None) -> None:
        """The run finished (``error`` None) or broke."""


class Checkpointer(Callback):
    """A checkpoint every engine.checkpoint_every rounds and at the last one (0: none)."""

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        every, rounds = run.plan.cfg.engine.checkpoint_every, run.plan.cfg.train.rounds
        if every and (result.round % every == 0 or result.round == rounds):
            run.save_checkpoint(result.round)


def drive(run: Run, checkpoint: str | None) -> None:
    """Restore the server from ``checkpoint`` (None: round 0), train every round left, save the final model."""
    done = run.call(run.server.restore.remote(checkpoint))
    _tell(run, "on_run_start", done)
    round_idx = done + 1
    while round_idx <= run.plan.cfg.train.rounds:
        try:
            result = run.call(run.server.round.remote(round_idx))
            if isinstance(result, RoundFailed):
                raise TrainingDiverged(result.error)
            if isinstance(result, RolledBack):  # a worker died: redo everything since the last checkpoint
                raise RollBack(result.to_round)
            _tell(run, "on_round_end", result)
        except RollBack as back:
            _tell(run, "on_rollback", back.to_round)
            round_idx = back.to_round + 1
            continue
        round_idx += 1
    run.workers = run.call(run.server.worker_info.remote())
    final: np.ndarray = run.call(run.server.global_weights.remote())
    run.folder.save_final_model(run.plan, final)


def _tell(run: Run, hook: str, *args: Any) -> None:
    for callback in run.callbacks:
        getattr(callback, hook)(run, *args)


def end(run: Run, error: BaseException | None) -> None:
    """Tell every callback the run ended, then publish the folder (also after a failure: the metrics so far)."""
    try:
        _tell(run, "on_run_end", error)
    finally:
        run.folder.publish()
