"""A run's folder while the run holds it: locked, written (a new run's data digest, partition and config; a resumed
run's config), published to an object store, and given its final model. Where it lives is chosen once
(:class:`LocalFolder`, :class:`BucketFolder`); what is checked before Ray starts, and written nowhere, is
``runfolder_checks``'s. Every whole file it writes goes through ``atomic.write_text`` or ``atomic.write_bytes``
(written beside, fsynced, renamed), so a crash never leaves one half-written."""
from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import numpy as np
import yaml

from fedsim import atomic, storage
from fedsim.config import RunConfig
from fedsim.core import checkpoint, runfiles
from fedsim.data import ArrayDataset, Partition
from fedsim.engine import runlock
from fedsim.engine.failures import describe_failure
from fedsim.errors import ConfigError, RunFailed, resume_command
from fedsim.plan import RunPlan
from fedsim.plugins import names_code


def refuse_no_config(store: storage.Store, where: str | Path) -> None:
    if not store.exists(runfiles.CONFIG):
        raise ConfigError(f"{where}: not a run folder (no {runfiles.CONFIG}); pass the folder a `fedsim run` created")


class LocalFolder:
    """A run folder on this machine's (or the cluster's shared) disk: written in place, locked while a run holds it."""

    def __init__(self, location: str):
        self.location = location
        # Absolute: the server actor and the marker check must not depend on a process's working folder.
        self.local = storage.user_path(location).resolve()
        self.run_dir: str | Path = self.local

    def refuse_live(self) -> None:
        """Fail fast, before Ray starts, when another process runs this folder (``lock`` is the real guard)."""
        runlock.refuse_if_live(self.local)

    def has_run(self) -> bool:
        return self.local.exists() and any(p.name != runfiles.LOCK for p in self.local.iterdir())

    def fetch(self) -> None:
        """A resumed run's files are here already."""

    def lock(self) -> AbstractContextManager[object]:
        """Held until the run ends: a second run of this folder, or --overwrite meanwhile, is refused."""
        return runlock.hold(self.local)

    def clear(self) -> None:
        """--overwrite: the new run's files replace the old ones as they are written."""

    def publish(self) -> None:
        """Written in place: nothing to upload."""

    @property
    def checkpoints_location(self) -> str:
        return str(self.local)

    def checkpoint_location(self, ckpt: Path) -> str:
        return str(ckpt)

    def written(self) -> str:
        ckpt = checkpoint.latest(self.local)
        if ckpt is None:
            return "its config and partition, no checkpoint yet (resume starts at round 1)"
        return f"its config, partition, metrics and checkpoints up to round {checkpoint.round_of(ckpt)}"

    def close(self) -> None:
        """Nothing to remove: the folder is the run's."""


class BucketFolder:
    """A run folder in an object store (a URI): written in a staging copy private to this process, whose new or
    changed files are uploaded at every checkpoint and at the end (checkpoints themselves go straight to the store).
    It has no lock: the staging copy is private anyway."""

    def __init__(self, location: str):
        self.location = location
        self.store = storage.Store(location)
        self.local = storage.staging_folder(location)
        self.run_dir: str | Path = location
        self.stored: dict[Path, tuple[int, int]] = {}  # staging file -> (mtime, size) when it was last uploaded

    def refuse_live(self) -> None:
        """A bucket has no lock to read."""

    def has_run(self) -> bool:
        return bool(self.store.files())

    def fetch(self) -> None:
        """A resumed run's files brought into the staging copy."""
        refuse_no_config(self.store, self.location)
        self.store.download_tree(self.local)
        self.stored = {path: _stamp(path) for path in self._files()}

    def lock(self) -> AbstractContextManager[object]:
        return nullcontext()

    def clear(self) -> None:
        """--overwrite: the stored run goes before the new one is written."""
        self.store.delete("")

    def publish(self) -> None:
        """Upload the run's new or changed files (metrics, config, W&B) from the staging copy."""
        for path in self._files():
            if self.stored.get(path) != _stamp(path):
                self.stored[path] = _stamp(path)
                self.store.upload(path, path.relative_to(self.local).as_posix())

    @property
    def checkpoints_location(self) -> str:
        return self.location

    def checkpoint_location(self, ckpt: Path) -> str:
        return storage.join(self.location, runfiles.CHECKPOINTS, ckpt.name)

    def written(self) -> str:
        return "its config, partition, metrics and checkpoints so far"

    def close(self) -> None:
        storage.remove_staging(self.local)

    def _files(self) -> list[Path]:
        return sorted(p for p in self.local.rglob("*")
                      if p.is_file() and p.relative_to(self.local).parts[0] != runfiles.CHECKPOINTS)


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


class RunFolder:
    """A run's folder as this process sees it: ``local`` is where it writes, ``location`` where the run lives.
    For a local out_dir they are the same folder (:class:`LocalFolder`); for an object store ``local`` is a staging
    copy (:class:`BucketFolder`)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.location = storage.join(cfg.out_dir, cfg.name)
        self.backend = BucketFolder(self.location) if storage.is_uri(self.location) else LocalFolder(self.location)
        self.local = self.backend.local
        self.names_code = names_code(cfg)  # resume then needs --trust-plugins

    @property
    def resume_command(self) -> str:
        return resume_command(self.location, self.names_code)

    def written(self) -> str:
        """What the folder holds of a run that stopped under way, for the line that says how to continue it."""
        return self.backend.written()

    @property
    def checkpoints_location(self) -> str:
        """Where the server and the workers write checkpoints: the store itself for a URI, else the folder."""
        return self.backend.checkpoints_location

    def refuse_existing(self, overwrite: bool) -> None:
        if self.backend.has_run() and not overwrite:
            raise ConfigError(f"{self.location}: run folder already exists; pass --resume {self.location} to continue "
                              "it, --overwrite to replace it, or change name")

    # -- while the run holds it ------------------------------------------------------------------
    @contextmanager
    def held(self, data: ArrayDataset, partition: Partition, resume: bool, overwrite: bool) -> Iterator[None]:
        """The folder locked for the run until the block ends and made ready: a resumed run's config.yaml
        rewritten (an extended train.rounds is remembered); a new run's folder refused again if it exists (another
        run may have filled it since it was checked), then written (``create``)."""
        with self.backend.lock():
            if resume:
                self._write_config()
            else:
                self.refuse_existing(overwrite)
                self.create(partition, data)
            yield

    def create(self, partition: Partition, data: ArrayDataset) -> None:
        """Write the new run's folder. Failing here (a full disk) is a run-time failure, but there is nothing to
        resume yet: the folder has no config.yaml, and the way on is to start again."""
        try:
            self.backend.clear()
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
        # how the data was built (shakespeare's clients, text per client, vocabulary) beside what a resume checks
        about = {} if data.about is None else {"about": dict(data.about)}
        atomic.write_text(run_dir / runfiles.DATASET,
                          json.dumps({"dataset": self.cfg.data.dataset, "digest": data.digest, **about}))
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
        """Make the run's new or changed files (metrics, config, W&B) the stored run's; checkpoints are not among
        them (workers and the server write those to where the run lives themselves)."""
        self.backend.publish()

    def checkpoint_location(self, ckpt: Path) -> str:
        return self.backend.checkpoint_location(ckpt)

    def close(self) -> None:
        self.backend.close()


def _remove_tree(path: Path) -> None:
    """``path`` gone: a link itself (never what it points to), a folder with what it holds."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
