"""What a run folder must pass before Ray starts, with nothing written to it: a resumed run's stored config (its
plug-ins imported only when trusted), the folder refused while another process runs it or when it exists without
--overwrite, and a resumed run's files checked against this config and data (the data's digest, the results
against the checkpoint, the stored partition, then the checkpoint against the plan)."""
from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsim import safe_files, storage
from fedsim.config import RunConfig, load_tree, parse_overrides, validate
from fedsim.core import checkpoint, runfiles
from fedsim.core.results import read_results
from fedsim.data import ArrayDataset, Partition
from fedsim.data.array_dataset import recomputed_digest
from fedsim.engine.runfolder import RunFolder, refuse_no_config
from fedsim.errors import CheckpointError, ConfigError, DataError, ResultsDamaged
from fedsim.plan import RunPlan
from fedsim.plugins import plugin_settings


def load_run_config(run_dir: str | Path, overrides: Sequence[str] = (), trust_plugins: bool = False,
                    command: str = "resume") -> RunConfig:
    """The resolved config a run folder (a path or a URI) was started with (for --resume). A run folder is input:
    code its config names (plug-in strings) is imported only with ``trust_plugins`` or when ``overrides`` name the
    same key, so resuming someone else's folder never runs their code unasked; the refusal names ``command``, the
    one that asked (both of its fixes are ones every caller accepts)."""
    store = storage.Store(run_dir)
    refuse_no_config(store, run_dir)
    out_dir, name = storage.parent_and_name(str(run_dir))
    with tempfile.TemporaryDirectory(prefix="fedsim-config-") as tmp:
        config = Path(tmp, runfiles.CONFIG)
        config.write_bytes(store.read_bytes(runfiles.CONFIG))
        tree, stored = load_tree(config, overrides), load_tree(config)
    if not trust_plugins:
        _refuse_folder_code(run_dir, tree, overrides, command)
    tree.update(name=name, out_dir=out_dir)
    cfg = validate(tree)
    changed = runfiles.compare_stored(stored, cfg)[1] if overrides else []
    if changed:
        raise ConfigError(f"{changed[0]}: a resumed run cannot change it (it changes what the run computes); resume "
                          "accepts train.rounds, logging.* and engine settings other than threads_per_worker and "
                          "memory_format; start a new run with another name instead")
    return cfg


def _refuse_folder_code(run_dir: str | Path, tree: dict[str, Any], overrides: Sequence[str], command: str) -> None:
    """Every plug-in the resumed config names must be the user's: the command line gives that very field that very
    plug-in string, or the folder is trusted. A command-line key that merely contains the field (``algorithm={}``)
    leaves the folder's string in place, so it does not count."""
    given = plugin_settings(parse_overrides(list(overrides)))
    for key, spec in plugin_settings(tree).items():
        if given.get(key) != spec:
            base = key.split("[")[0]
            raise ConfigError(f"{key}: {run_dir}/{runfiles.CONFIG} names code to run ({spec!r}); {command} imports it "
                              f"only if you trust this folder: pass --trust-plugins, or give {base}={spec} on the "
                              "command line")


def open_folder(folder: RunFolder, data: ArrayDataset, partition: Partition, resume: bool,
                overwrite: bool) -> tuple[Partition, Path | None]:
    """Check the folder for this run before Ray starts: refused while another process runs it; for a resume,
    the stored run brought here and checked (:func:`open_for_resume`: its own partition and the checkpoint it
    continues from); for a new run, refused if it exists and ``overwrite`` is not given (``partition``, no
    checkpoint). Nothing is written to the folder."""
    folder.backend.refuse_live()
    if resume:
        return open_for_resume(folder, data)
    folder.refuse_existing(overwrite)
    return partition, None


def open_for_resume(folder: RunFolder, data: ArrayDataset) -> tuple[Partition, Path | None]:
    """Bring a stored run's files here and check them against this config and data; returns the run's own
    partition and the checkpoint it continues from (None: round 0). The checkpoint is validated against
    the plan once the plan is built (:func:`check_checkpoint`)."""
    folder.backend.fetch()
    _refuse_changed_data(folder.local, data)
    ckpt = checkpoint.latest(folder.local)
    done = 0 if ckpt is None else checkpoint.round_of(ckpt)
    assert done is not None  # latest() chooses round-N folders only
    _check_results(folder.local, folder.cfg, done)
    partition = Partition.load(folder.local / runfiles.PARTITION)
    clients = folder.cfg.data.num_clients
    if partition.num_clients != clients:
        raise DataError(f"{folder.local / runfiles.PARTITION}: holds {partition.num_clients} clients, the run's config "
                        f"{clients}; restore the file from a backup, or start a new run")
    return partition, ckpt


def _check_results(run_dir: Path, cfg: RunConfig, done: int) -> None:
    """The result files agree with the checkpoint resume continues from: every row readable, a row in
    rounds.jsonl for each of its rounds, and the checkpoint within train.rounds. Checked before anything
    is rewritten."""
    rows = {name: read_results(run_dir / name) for name in runfiles.JSONL_RESULTS}
    if done > cfg.train.rounds:
        raise ConfigError(f"train.rounds: the run's checkpoint is at round {done}, beyond train.rounds="
                          f"{cfg.train.rounds}; resume with train.rounds={done} or more")
    logged = {r["round"] for r in rows[runfiles.ROUNDS]}
    missing = [r for r in range(1, done + 1) if r not in logged]
    if missing:
        raise ResultsDamaged(f"{run_dir / runfiles.ROUNDS}: no row for round {missing[0]} though the checkpoint is "
                             f"at round {done}; restore the file from a backup, or start a new run")


def check_checkpoint(ckpt: Path | None, plan: RunPlan) -> None:
    """The checkpoint was trained on this run's partition (its state.json records the partition's digest)."""
    if ckpt is None:
        return
    state, _, _ = checkpoint.read_state(ckpt, plan.fingerprint, plan.model.layouts["shared"].size)
    if state.get("partition", plan.partition_digest) != plan.partition_digest:
        raise CheckpointError(
            f"{ckpt.parent.parent / runfiles.PARTITION}: not the partition this run's checkpoints were trained on "
            "(its clients or their samples changed); restore it from a backup, or start a new run")


def _refuse_changed_data(run_dir: Path, data: ArrayDataset) -> None:
    """The partition stored in the run folder indexes the data set as it was: same counts with other
    images would silently train on different data."""
    try:
        started_with = json.loads(safe_files.read_text(run_dir / runfiles.DATASET))["digest"]
    except FileNotFoundError:
        return  # a run folder from before data digests: nothing to compare with
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"data.root: {run_dir / runfiles.DATASET} is unreadable ({err}); restore it from a "
                        "backup") from None
    if not started_with:
        return  # started on a user's data set before those had a content hash
    now = recomputed_digest(data)  # a cache changed in place keeps its old recorded digest: hash the arrays
    if started_with != now:
        raise DataError(f"data.root: the {data.name} data changed since this run started (content {started_with}, "
                        f"now {now}); restore the original files, or start a new run")
