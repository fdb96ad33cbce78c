"""A run folder's layout, stated once: the name of every file a run writes there, and the comparison of the config
stored in it with another. The engine writes these files, metrics and W&B log into them, sweeps and reproductions
read them back, the CLI reports them. Torch- and Ray-free, so the lightest of those readers stay light.

    RUN/config.yaml            the resolved config the run is running (written last: a folder with it is complete)
    RUN/dataset.json           the data set's name and content digest (a resume over changed data is refused), and
                               how it was built where the data set says (shakespeare: clients, text, vocabulary)
    RUN/partition.npz          which client holds which samples; partition_stats.json: its per-client counts
    RUN/metrics.jsonl          a record per client and evaluation round
    RUN/rounds.jsonl           a row per round; rounds.csv: the evaluation rounds' statistics as columns
    RUN/comm.jsonl             the traffic per client and round
    RUN/summary.json           written when the run finishes
    RUN/parts.json             each invocation that ran it (the first, each resume) and its wall time
    RUN/model.npz              the final global weights (what another run's model.init_from reads)
    RUN/checkpoints/           the checkpoints (``fedsim.core.checkpoint``)
    RUN/wandb/                 the W&B run's own files; wandb_run.json: which W&B run a resume continues
    RUN/.lock                  held by the live run (``fedsim.engine.runlock``)
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from fedsim.config import RunConfig, changed_settings, validate

CONFIG = "config.yaml"
DATASET = "dataset.json"
PARTITION = "partition.npz"
PARTITION_STATS = "partition_stats.json"
METRICS = "metrics.jsonl"
ROUNDS = "rounds.jsonl"
ROUNDS_CSV = "rounds.csv"
COMM = "comm.jsonl"
SUMMARY = "summary.json"
PARTS = "parts.json"
MODEL = "model.npz"
CHECKPOINTS = "checkpoints"
WANDB = "wandb"
WANDB_RUN = "wandb_run.json"
LOCK = ".lock"
EXPORT = "export"  # fedsim export's default folder
LIGHTNING = "lightning"  # what Lightning's callbacks write under the Trainer loop (a ModelCheckpoint's files)

JSONL_RESULTS = (METRICS, ROUNDS, COMM)  # appended each round, truncated on resume
RESULT_FILES = (*JSONL_RESULTS, ROUNDS_CSV, SUMMARY, PARTS)  # what a new run starts without (--overwrite removes them)
RESULT_FOLDERS = (EXPORT, LIGHTNING)  # made from a run's results: --overwrite removes them with the files


def compare_stored(stored: dict[str, Any], cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """The config tree a run folder stored, resolved as the run ``cfg`` names (that folder's name and out_dir, and
    ``model.init_from`` as ``anchored_init_from`` reads it), and the settings a resume may not change (dotted keys)
    whose values differ between it and ``cfg``. Raises the ConfigError of a stored tree that no longer validates."""
    before = validate({**stored, "name": cfg.name, "out_dir": cfg.out_dir, **anchored_init_from(stored, cfg)})
    return before, changed_settings(before.model_dump(), cfg.model_dump())


def anchored_init_from(stored: dict[str, Any], cfg: RunConfig) -> dict[str, Any]:
    """The stored tree's model section with ``cfg``'s ``init_from`` where the stored one names the same run folder
    relative to the stored out_dir as ``cfg``'s does relative to its out_dir, else nothing to change ({}). The
    anchor is the runs folder: a runs folder moved or restored whole on another machine (kept reproduction runs on a
    fresh clone, where LG-FedAvg starts from its FedAvg sibling) names the same sibling run at another absolute
    path, which is not a change. Whether that run's model changed since is told by its file times (the
    reproduction runner's ``_ran_again``), as a changed data set is told by its digest, not by a path."""
    model, anchor, wanted = stored.get("model"), stored.get("out_dir"), cfg.model.init_from
    if not isinstance(model, dict):
        return {}
    source = model.get("init_from")
    if not isinstance(source, str) or not isinstance(anchor, str) or wanted is None or source == wanted:
        return {}
    path, root = PurePosixPath(source), PurePosixPath(anchor)
    if path == root or not path.is_relative_to(root):
        return {}
    if PurePosixPath(cfg.out_dir) / path.relative_to(root) != PurePosixPath(wanted):
        return {}
    return {"model": {**model, "init_from": wanted}}
