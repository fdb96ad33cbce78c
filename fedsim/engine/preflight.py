"""What a run checks before Ray starts, in one place for the run and for ``--dry-run``: a local run's resources and
spill folder against this machine, its inputs (data,
partition, plug-ins, model, callbacks), its run folder (exists, held by another process, a resume's stored files
and checkpoint) and, given a ``rehearse`` function, one training step of the client module in this process. So a
dry run refuses whatever a run would refuse before its first round."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray

from fedsim.config import RunConfig
from fedsim.core.store import check_spill_dir
from fedsim.data import Partition
from fedsim.engine.ray_cluster import refuse_beyond_this_machine
from fedsim.engine.runfolder import RunFolder
from fedsim.engine.runfolder_checks import check_checkpoint, open_folder
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
    local = not os.environ.get("RAY_ADDRESS")
    if local and not ray.is_initialized():
        refuse_beyond_this_machine(cfg)  # before the data loads: a million workers' data could take hours
    inputs = load_inputs(cfg)
    if local:  # a cluster's workers spill on disks of their own, which this one is not
        check_spill_dir(cfg.engine.spill_dir)
    folder = RunFolder(cfg)
    try:
        partition, ckpt = open_folder(folder, inputs.data, inputs.partition, resume, overwrite)
        plan = build_plan(cfg, inputs, partition)
        check_checkpoint(ckpt, plan)
        if rehearse is not None:
            rehearse(plan)  # the module's mistakes now, not from a worker after Ray and the workers started
        yield Prepared(inputs, folder, partition, ckpt, plan)
    finally:
        folder.close()
