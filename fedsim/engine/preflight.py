"""What a run checks before Ray starts, in one place for the run and for ``--dry-run``: its inputs (data,
partition, plug-ins, model, callbacks), its run folder (exists, held by another process, a resume's stored files
and checkpoint) and, given a ``rehearse`` function, one training step of the client module in this process. So a
dry run refuses whatever a run would refuse before its first round."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedsim.config import RunConfig
from fedsim.data import Partition
from fedsim.engine.runfolder import RunFolder
from fedsim.plan import RunPlan
from fedsim.plan.build import Inputs, build_plan, load_inputs

Rehearse = Callable[[RunPlan], None]
"""``rehearse(plan)``: one training step of the client module in this process, raising what a worker would
(``fedsim.client.rehearsal.rehearse``; the engine never imports the client)."""


@dataclass(frozen=True)
class Prepared:
    """A run checked before Ray starts: its inputs, its (open, unwritten) folder, the partition it trains over
    (a resumed run's own), the checkpoint it continues from and its plan."""
    inputs: Inputs
    folder: RunFolder
    partition: Partition
    checkpoint: Path | None
    plan: RunPlan


@contextmanager
def prepared(cfg: RunConfig, resume: bool = False, overwrite: bool = False,
             rehearse: Rehearse | None = None) -> Iterator[Prepared]:
    """Every check before Ray starts, in the run's order; the folder is closed when the block ends (nothing is
    written to it here)."""
    inputs = load_inputs(cfg)
    folder = RunFolder(cfg)
    try:
        partition, ckpt = folder.open(inputs.data, inputs.partition, resume, overwrite)
        plan = build_plan(cfg, inputs, partition)
        folder.check_checkpoint(ckpt, plan)
        if rehearse is not None:
            rehearse(plan)  # the module's mistakes now, not from a worker after Ray and the workers started
        yield Prepared(inputs, folder, partition, ckpt, plan)
    finally:
        folder.close()
