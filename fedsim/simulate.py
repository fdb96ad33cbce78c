"""``run(cfg)``: one simulation with the run folder's standard records, the API under ``fedsim run`` and
``fedsim reproduce``. It assembles the engine's session with its callbacks: the JSONL logger (the run
folder's metrics and summary), W&B when configured, the checkpointer, then the caller's own."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from fedsim.client.rehearsal import rehearse
from fedsim.client.worker import Worker, spawn_worker
from fedsim.config import RunConfig
from fedsim.engine.backend import Workers
from fedsim.engine.driver import Callback, Checkpointer
from fedsim.engine.session import run_session
from fedsim.metrics.logger import JsonlLogger

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

WORKERS = Workers(actor=spawn_worker, in_process=Worker)


@dataclass
class RunResult:
    name: str
    run_dir: Path | str  # a URI when out_dir is an object store
    summary: dict


def standard_callbacks(cfg: RunConfig) -> list[Callback]:
    """What every run records, in the order it must: metrics on disk first, then W&B, then the checkpoint
    that points at them."""
    callbacks: list[Callback] = [JsonlLogger()]
    if cfg.logging.wandb.mode != "disabled":
        from fedsim.metrics.wandb_sink import (
            WandbLogger,  # imports wandb (~1 s) only when it is used
        )

        callbacks.append(WandbLogger())
    return [*callbacks, Checkpointer()]


def run(cfg: RunConfig, overwrite: bool = False, resume: bool = False, callbacks: Sequence[Callback] = (),
        reserved: PlacementGroup | None = None) -> RunResult:
    """Run (or with ``resume``, continue) a simulation; ``callbacks`` are told of it after the standard ones.
    ``reserved``: the placement group (one bundle per worker) a caller such as a Tune trial holds for it.
    Bad input raises ConfigError/DataError/CheckpointError before anything is written; a failure once the
    run is under way raises RunFailed (with the resume command)."""
    session = run_session(cfg, WORKERS, [*standard_callbacks(cfg), *callbacks], overwrite, resume, reserved,
                          rehearse)
    assert session.summary is not None  # a standard callback, the JSONL logger, writes it as the run finishes
    folder = session.folder
    return RunResult(cfg.name, folder.backend.run_dir, session.summary)
