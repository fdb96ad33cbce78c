"""A run's folder: created, locked, checked on resume, replaced with --overwrite, published to an object
store, and given its final model. Every whole file it writes goes through ``atomic.write_text`` or
``atomic.write_bytes`` (written beside, fsynced, renamed), so a crash never leaves one half-written."""
from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedsim import atomic, storage
from fedsim.config import RunConfig, load_tree, parse_overrides, validate
from fedsim.core import checkpoint, runfiles
from fedsim.core.results import read_results
from fedsim.data import ArrayDataset, Partition
from fedsim.data.array_dataset import recomputed_digest
from fedsim.engine import runlock
from fedsim.engine.failures import describe_failure
from fedsim.errors import CheckpointError, ConfigError, DataError, ResultsDamaged, RunFailed, resume_command
from fedsim.plan import RunPlan
from fedsim.plugins import names_code, plugin_settings


def load_run_config(run_dir: str | Path, overrides: Sequence[str] = (), trust_plugins: bool = False) -> RunConfig:
    """The resolved config a run folder (a path or a URI) was started with (for --resume). A run folder is input:
    code its config names (plug-in strings) is imported only with ``trust_plugins`` or when ``overrides`` name the
    same key, so resuming someone else's folder never runs their code unasked."""
    store = storage.Store(run_dir)
    _refuse_no_config(store, run_dir)
    out_dir, name = storage.parent_and_name(str(run_dir))
    with tempfile.TemporaryDirectory(prefix="fedsim-config-") as tmp:
        config = Path(tmp, runfiles.CONFIG)
        config.write_bytes(store.read_bytes(runfiles.CONFIG))
        tree, stored = load_tree(config, overrides), load_tree(config)
    if not trust_plugins:
        _refuse_folder_code(run_dir, tree, overrides)
    tree.update(name=name, out_dir=out_dir)
    cfg = validate(tree)
    changed = runfiles.compare_stored(stored, cfg)[1] if overrides else []
    if changed:
        raise ConfigError(f"{changed[0]}: a resumed run cannot change it (it changes what the run computes); resume "
                          "accepts train.rounds, logging.* and engine settings other than threads_per_worker and "
                          "memory_format; start a new run with another name instead")
    return cfg


def _refuse_no_config(store: storage.Store, where: str | Path) -> None:
    if not store.exists(runfiles.CONFIG):
        raise ConfigError(f"{where}: not a run folder (no {runfiles.CONFIG}); pass the folder a `fedsim run` created")


def _refuse_folder_code(run_dir: str | Path, tree: dict[str, Any], overrides: Sequence[str]) -> None:
    """Every plug-in the resumed config names must be the user's: the command line gives that very field that very
    plug-in string, or the folder is trusted. A command-line key that merely contains the field (``algorithm={}``)
    leaves the folder's string in place, so it does not count."""
    given = plugin_settings(parse_overrides(list(overrides)))
    for key, spec in plugin_settings(tree).items():
        if given.get(key) != spec:
            base = key.split("[")[0]
            raise ConfigError(f"{key}: {run_dir}/{runfiles.CONFIG} names code to run ({spec!r}); resume imports it only "
                              f"if you trust this folder: pass --trust-plugins, or give {base}={spec} on the command line")


class RunFolder:
    """A run's folder as this process sees it: ``local`` is where it writes, ``location`` where the run lives.
    For a local out_dir they are the same folder. For an object store, ``local`` is a staging copy whose
    files are uploaded at every checkpoint and at the end (checkpoints themselves go straight to the store)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.location = storage.join(cfg.out_dir, cfg.name)
        self.remote = storage.is_uri(self.location)
        self.store = storage.Store(self.location) if self.remote else None  # None exactly when not remote
        # Absolute: the server actor and the marker check must not depend on a process's working folder.
        self.local = storage.staging_folder(self.location) if self.remote else storage.user_path(self.location).resolve()
        self.stored: dict[Path, tuple[int, int]] = {}  # staging file -> (mtime, size) when it was last uploaded
        self.names_code = names_code(cfg)  # resume then needs --trust-plugins

    @property
    def resume_command(self) -> str:
        return resume_command(self.location, self.names_code)

    def written(self) -> str:
        """What the folder holds of a run that stopped under way, for the line that says how to continue it."""
        if self.remote:
            return "its config, partition, metrics and checkpoints so far"
        ckpt = checkpoint.latest(self.local)
        if ckpt is None:
            return "its config and partition, no checkpoint yet (resume starts at round 1)"
        return f"its config, partition, metrics and checkpoints up to round {checkpoint.round_of(ckpt)}"

    @property
    def checkpoints_location(self) -> str:
        """Where the server and the workers write checkpoints: the store itself for a URI, else the folder."""
        return self.location if self.remote else str(self.local)

    # -- before Ray starts -----------------------------------------------------------------------
    def open(self, data: ArrayDataset, partition: Partition, resume: bool,
             overwrite: bool) -> tuple[Partition, Path | None]:
        """Check the folder for this run before Ray starts: refused while another process runs it; for a resume,
        the stored run brought here and checked (``open_for_resume``: its own partition and the checkpoint it
        continues from); for a new run, refused if it exists and ``overwrite`` is not given (``partition``, no
        checkpoint). Nothing is written to the folder."""
        self._refuse_live()
        if resume:
            return self.open_for_resume(data)
        self._refuse_existing(overwrite)
        return partition, None

    def _refuse_live(self) -> None:
        """Fail fast, before Ray starts, when another process runs this folder (``_lock`` is the real guard)."""
        if not self.remote:
            runlock.refuse_if_live(self.local)

    def _refuse_existing(self, overwrite: bool) -> None:
        exists = (self.store.files() if self.store is not None else
                  self.local.exists() and any(p.name != runfiles.LOCK for p in self.local.iterdir()))
        if exists and not overwrite:
            raise ConfigError(f"{self.location}: run folder already exists; pass --resume {self.location} to continue "
                              "it, --overwrite to replace it, or change name")

    def open_for_resume(self, data: ArrayDataset) -> tuple[Partition, Path | None]:
        """Bring a stored run's files here and check them against this config and data; returns the run's own
        partition and the checkpoint it continues from (None: round 0). The checkpoint is validated against
        the plan once the plan is built (``check_checkpoint``)."""
        if self.store is not None:
            _refuse_no_config(self.store, self.location)
            self.store.download_tree(self.local)
            self.stored = {path: self._stamp(path) for path in self._files()}
        self._refuse_changed_data(data)
        ckpt = checkpoint.latest(self.local)
        done = 0 if ckpt is None else checkpoint.round_of(ckpt)
        assert done is not None  # latest() chooses round-N folders only
        self._check_results(done)
        partition = Partition.load(self.local / runfiles.PARTITION)
        if partition.num_clients != self.cfg.data.num_clients:
            raise DataError(f"{self.local / runfiles.PARTITION}: holds {partition.num_clients} clients, the run's config "
                            f"{self.cfg.data.num_clients}; restore the file from a backup, or start a new run")
        return partition, ckpt

    def _check_results(self, done: int) -> None:
        """The result files agree with the checkpoint resume continues from: every row readable, a row in
        rounds.jsonl for each of its rounds, and the checkpoint within train.rounds. Checked before anything
        is rewritten."""
        rows = {name: read_results(self.local / name) for name in runfiles.JSONL_RESULTS}
        if done > self.cfg.train.rounds:
            raise ConfigError(f"train.rounds: the run's checkpoint is at round {done}, beyond train.rounds="
                              f"{self.cfg.train.rounds}; resume with train.rounds={done} or more")
        logged = {r["round"] for r in rows[runfiles.ROUNDS]}
        missing = [r for r in range(1, done + 1) if r not in logged]
        if missing:
            raise ResultsDamaged(f"{self.local / runfiles.ROUNDS}: no row for round {missing[0]} though the checkpoint is "
                                 f"at round {done}; restore the file from a backup, or start a new run")

    @staticmethod
    def check_checkpoint(ckpt: Path | None, plan: RunPlan) -> None:
        """The checkpoint was trained on this run's partition (its state.json records the partition's digest)."""
        if ckpt is None:
            return
        state, _, _ = checkpoint.read_state(ckpt, plan.fingerprint, plan.model.layouts["shared"].size)
        if state.get("partition", plan.partition_digest) != plan.partition_digest:
            raise CheckpointError(
                f"{ckpt.parent.parent / runfiles.PARTITION}: not the partition this run's checkpoints were trained on "
                "(its clients or their samples changed); restore it from a backup, or start a new run")

    def _refuse_changed_data(self, data: ArrayDataset) -> None:
        """The partition stored in the run folder indexes the data set as it was: same counts with other
        images would silently train on different data."""
        try:
            started_with = json.loads((self.local / runfiles.DATASET).read_text())["digest"]
        except FileNotFoundError:
            return  # a run folder from before data digests: nothing to compare with
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"data.root: {self.local / runfiles.DATASET} is unreadable ({err}); restore it from a "
                            "backup") from None
        if not started_with:
            return  # started on a user's data set before those had a content hash
        now = recomputed_digest(data)  # a cache changed in place keeps its old recorded digest: hash the arrays
        if started_with != now:
            raise DataError(f"data.root: the {data.name} data changed since this run started (content {started_with}, "
                            f"now {now}); restore the original files, or start a new run")

    # -- while the run holds it ------------------------------------------------------------------
    @contextmanager
    def held(self, data: ArrayDataset, partition: Partition, resume: bool, overwrite: bool) -> Iterator[None]:
        """The folder locked for the run until the block ends and made ready: a resumed run's config.yaml
        rewritten (an extended train.rounds is remembered); a new run's folder refused again if it exists (another
        run may have filled it since ``open``), then written (``create``)."""
        with self._lock():
            if resume:
                self._write_config()
            else:
                self._refuse_existing(overwrite)
                self.create(partition, data)
            yield

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Held until the run ends: a second run of this folder, or --overwrite meanwhile, is refused. An
        object store has no such lock: there the staging copy is private to this process anyway."""
        with nullcontext() if self.remote else runlock.hold(self.local):
            yield

    def create(self, partition: Partition, data: ArrayDataset) -> None:
        """Write the new run's folder. Failing here (a full disk) is a run-time failure, but there is nothing to
        resume yet: the folder has no config.yaml, and the way on is to start again."""
        try:
            if self.store is not None:
                self.store.delete("")  # --overwrite: the stored run goes before the new one is written
            self._write_new(partition, data)
            self.publish()
        except OSError as err:
            raise RunFailed(describe_failure(err), self.location, resumable=False) from err

    def _write_new(self, partition: Partition, data: ArrayDataset) -> None:
        run_dir = self.local
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in runfiles.RESULT_FILES:
            (run_dir / stale).unlink(missing_ok=True)
        for folder in runfiles.RESULT_FOLDERS:  # an old run's exports beside new results would claim to be theirs
            _remove_tree(run_dir / folder)
        checkpoint.remove_all(run_dir)
        atomic.write_text(run_dir / runfiles.DATASET, json.dumps({"dataset": self.cfg.data.dataset, "digest": data.digest}))
        partition.save(run_dir / runfiles.PARTITION)
        stats = partition.stats(data.train_y, data.test_y, data.num_classes)
        atomic.write_text(run_dir / runfiles.PARTITION_STATS, json.dumps(stats, indent=1))
        self._write_config()  # last: a folder with a config.yaml is a complete run folder, fit to resume

    def _write_config(self) -> None:
        """config.yaml always holds what the run is running now: a resume that extends train.rounds updates it,
        so a later plain resume (and summary.json) keep the new round count."""
        atomic.write_text(self.local / runfiles.CONFIG, yaml.safe_dump(self.cfg.model_dump(), sort_keys=False))

    def save_final_model(self, plan: RunPlan, global_vector: np.ndarray) -> None:
        """``model.npz``: the final global weights by state-dict key, what another run's model.init_from reads."""
        buffer = io.BytesIO()
        # numpy's stub puts **kwds beside the flag allow_pickle: bool, so mypy takes any key of the dict for the flag;
        # these keys are the model's state-dict keys, saved as arrays.
        np.savez(buffer, **plan.model.layouts["shared"].arrays(global_vector))  # type: ignore[arg-type]
        atomic.write_bytes(self.local / runfiles.MODEL, buffer.getvalue())

    def publish(self) -> None:
        """Upload the run's new or changed files (metrics, config, W&B) from the staging copy; checkpoints are
        not among them (workers and the server write those to the store themselves)."""
        if self.store is not None:
            for path in self._files():
                if self.stored.get(path) != self._stamp(path):
                    self.stored[path] = self._stamp(path)
                    self.store.upload(path, path.relative_to(self.local).as_posix())

    def checkpoint_location(self, ckpt: Path) -> str:
        return storage.join(self.location, runfiles.CHECKPOINTS, ckpt.name) if self.remote else str(ckpt)

    def _files(self) -> list[Path]:
        return sorted(p for p in self.local.rglob("*")
                      if p.is_file() and p.relative_to(self.local).parts[0] != runfiles.CHECKPOINTS)

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int]:
        stat = path.stat()
        return stat.st_mtime_ns, stat.st_size

    def close(self) -> None:
        if self.remote:
            storage.remove_staging(self.local)


def _remove_tree(path: Path) -> None:
    """``path`` gone: a link itself (never what it points to), a folder with what it holds."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
