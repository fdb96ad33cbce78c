"""Run one configured simulation: validate inputs, start Ray, loop rounds, checkpoint, write the run folder."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import ray
import yaml
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fedsim import atomic, storage
from fedsim.config import ConfigError, RunConfig, validate
from fedsim.data import ArrayDataset, DataError, Partition, load_dataset, make_partition
from fedsim.engine import checkpoint, placement, runlock
from fedsim.algorithms import build_algorithm
from fedsim.client.runtime import initial_model, load_client_class, read_initial_weights, shared_layout
from fedsim.engine.actors import ServerActor, spawn_worker
from fedsim.engine.protocol import RolledBack, RoundFailed
from fedsim.engine.server import assign_clients
from fedsim.errors import RunFailed
from fedsim.metrics import summarize
from fedsim.metrics.logger import RunLogger

RoundCallback = Callable[[dict, dict], None]


class TrainingDiverged(ValueError):
    """A client's loss became NaN/Inf and train.on_nonfinite is 'stop'."""


@dataclass
class RunResult:
    name: str
    run_dir: Path | str  # a URI when out_dir is an object store
    summary: dict


def connect_ray(cfg: RunConfig) -> None:
    """Attach to a cluster when RAY_ADDRESS is set, else start a local Ray sized for the workers."""
    if ray.is_initialized():
        return
    quiet = {"log_to_driver": True, "configure_logging": True, "logging_level": "warning"}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **quiet)
        return
    engine = cfg.engine
    cpus = max(os.cpu_count() or 1, int(engine.workers * engine.cpus_per_worker + 0.999))
    # The dashboard stays on loopback unless a user binds it elsewhere on purpose.
    # address="local": always a fresh local instance, never a stray cluster left behind by `ray start`.
    ray.init(address="local", num_cpus=cpus, include_dashboard=engine.dashboard, dashboard_host="127.0.0.1", **quiet)


def check_resources(cfg: RunConfig) -> None:
    """Fail fast where Ray would otherwise wait forever for resources that do not exist."""
    engine, have = cfg.engine, ray.cluster_resources()
    workers = min(engine.workers, cfg.data.num_clients)
    for resource, each in (("GPU", engine.gpus_per_worker), ("CPU", engine.cpus_per_worker)):
        need = workers * each
        if need > have.get(resource, 0) + 1e-9:
            field = "gpus_per_worker" if resource == "GPU" else "cpus_per_worker"
            raise ConfigError(f"engine.{field}: {workers} workers x {each} need {need:g} {resource}, the Ray cluster "
                              f"has {have.get(resource, 0):g}; lower engine.workers or engine.{field}")


def prepare_inputs(cfg: RunConfig) -> tuple[ArrayDataset, Partition, dict | None]:
    """Everything that can be wrong with the inputs is found here, before any file is written.
    Returns the data, the partition and the initial weights of model.init_from (or None)."""
    d = cfg.data
    data = load_dataset(d.dataset, d.root, d.download, options=d.options)  # decodes once; workers then mmap
    groups = None if data.train_groups is None else (data.train_groups, data.test_groups)
    partition = make_partition(d.partition, data.train_y, data.test_y, d.num_clients, cfg.seed, k=d.k,
                               shards_per_client=d.shards_per_client, beta=d.beta, groups=groups,
                               shard_style=d.shard_style,
                               train_fraction=d.train_fraction, test_fraction=d.test_fraction)
    load_client_class(cfg.model.client)
    init_weights = read_initial_weights(cfg.model.init_from) if cfg.model.init_from else None
    try:
        net = initial_model(cfg, build_algorithm(cfg), data.num_classes, data.input_shape, init_weights)
        net.head_prefixes(cfg.model.personal_layers)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return data, partition, init_weights


def _refuse_existing(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and any(p.name != runlock.LOCK_NAME for p in run_dir.iterdir()) and not overwrite:
        raise ConfigError(f"{run_dir}: run folder already exists; pass --resume {run_dir} to continue it, "
                          "--overwrite to replace it, or change name")


def _start_new(run_dir: Path, cfg: RunConfig, partition: Partition, data: ArrayDataset) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "rounds.jsonl", "comm.jsonl", "rounds.csv", "summary.json"):
        (run_dir / stale).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    atomic.write_text(run_dir / DATASET_FILE, json.dumps({"dataset": cfg.data.dataset, "digest": data.digest}))
    partition.save(run_dir / "partition.npz")
    stats = partition.stats(data.train_y, data.test_y, data.num_classes)
    (run_dir / "partition_stats.json").write_text(json.dumps(stats, indent=1))
    _write_config(run_dir, cfg)  # last: a folder with a config.yaml is a complete run folder, fit to resume


def load_run_config(run_dir: str | Path, overrides: list[str] = ()) -> RunConfig:
    """The resolved config a run folder (a path or a URI) was started with (for --resume)."""
    from fedsim.config import load_tree

    store = storage.Store(run_dir)
    if not store.exists("config.yaml"):
        raise ConfigError(f"{run_dir}: not a run folder (no config.yaml); pass the folder a `fedsim run` created")
    out_dir, name = storage.parent_and_name(str(run_dir))
    with tempfile.TemporaryDirectory(prefix="fedsim-config-") as tmp:
        config = Path(tmp, "config.yaml")
        config.write_bytes(store.read_bytes("config.yaml"))
        tree, stored = load_tree(config, overrides), load_tree(config)
    for t in (tree, stored):
        t.update(name=name, out_dir=out_dir)
    cfg = validate(tree)
    changed = checkpoint.changed_settings(validate(stored).model_dump(), cfg.model_dump()) if overrides else []
    if changed:
        raise ConfigError(f"{changed[0]}: a resumed run cannot change it (it changes what the run computes); resume "
                          "accepts train.rounds, logging.* and engine settings other than threads_per_worker and "
                          "memory_format; start a new run with another name instead")
    return cfg


DATASET_FILE = "dataset.json"


def _refuse_changed_data(run_dir: Path, data: ArrayDataset) -> None:
    """The partition stored in the run folder indexes the data set as it was: same counts with other
    images would silently train on different data."""
    try:
        started_with = json.loads((run_dir / DATASET_FILE).read_text())["digest"]
    except FileNotFoundError:
        return  # a run folder from before data digests: nothing to compare with
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"data.root: {run_dir / DATASET_FILE} is unreadable ({err}); restore it from a backup") from None
    if started_with != data.digest:
        raise DataError(f"data.root: the {data.name} data changed since this run started (content {started_with}, now "
                        f"{data.digest}); restore the original files, or start a new run")


def _write_config(run_dir: Path, cfg: RunConfig) -> None:
    """config.yaml always holds what the run is running now: a resume that extends train.rounds updates it,
    so a later plain resume (and summary.json) keep the new round count."""
    atomic.write_text(run_dir / "config.yaml", yaml.safe_dump(cfg.model_dump(), sort_keys=False))




def _this_node() -> NodeAffinitySchedulingStrategy:
    # The server actor stays on the submitting node so it shares that node's view of the run folder.
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def start_engine(cfg: RunConfig, partition: Partition, data: ArrayDataset, bundles: list,
                 init_weights: dict | None = None):
    """Spawn the workers (worker i in ``bundles[i]``) and the server actor together (the workers' ~3 s of
    imports overlap the server's start-up instead of following it). Returns the server's handle."""
    assignments = assign_clients(cfg, partition)
    init_ref = ray.put(init_weights) if init_weights else None
    workers = [spawn_worker(cfg, clients, init_ref, bundle) for clients, bundle in zip(assignments, bundles)]
    layout, initial_global = shared_layout(cfg, data.num_classes, data.input_shape, init_weights)
    return ServerActor.options(num_cpus=0, scheduling_strategy=_this_node()).remote(
        cfg, workers, assignments, initial_global, layout.offsets, init_ref, bundles)


def save_final_model(run_dir: Path, cfg: RunConfig, data: ArrayDataset, global_vector: np.ndarray) -> None:
    """``model.npz``: the final global weights by state-dict key, what another run's model.init_from reads."""
    layout, _ = shared_layout(cfg, data.num_classes, data.input_shape)
    arrays = {key: global_vector[start:end].reshape(shape)
              for key, shape, start, end in zip(layout.keys, layout.shapes, layout.offsets, layout.offsets[1:])}
    tmp = run_dir / ".model.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, run_dir / "model.npz")


def _sink(cfg: RunConfig, run_dir: Path, resume: bool):
    if cfg.logging.wandb.mode == "disabled":
        return None
    from fedsim.metrics.wandb_sink import WandbSink

    return WandbSink(cfg, run_dir, resume)


class RunFolder:
    """A run's folder as this process sees it: ``local`` is where it writes, ``location`` where the run lives.
    For a local out_dir they are the same folder. For an object store, ``local`` is a staging copy whose
    files are uploaded at every checkpoint and at the end (checkpoints themselves go straight to the store)."""

    def __init__(self, cfg: RunConfig):
        self.location = storage.join(cfg.out_dir, cfg.name)
        self.remote = storage.is_uri(self.location)
        self.store = storage.Store(self.location) if self.remote else None
        # Absolute: the driver actor and the marker check must not depend on a process's working folder.
        self.local = storage.staging_folder(self.location) if self.remote else Path(self.location).resolve()
        self.stored: dict[Path, tuple[int, int]] = {}  # staging file -> (mtime, size) when it was last uploaded

    def refuse_existing(self, overwrite: bool) -> None:
        if not self.remote:
            _refuse_existing(self.local, overwrite)
        elif self.store.files() and not overwrite:
            raise ConfigError(f"{self.location}: run folder already exists; pass --resume {self.location} to continue "
                              "it, --overwrite to replace it, or change name")

    def fetch(self) -> None:
        """Bring a stored run's files into the staging copy (to resume it)."""
        if self.remote:
            if not self.store.exists("config.yaml"):
                raise ConfigError(f"{self.location}: not a run folder (no config.yaml); pass the folder a `fedsim run` created")
            self.store.download_tree(self.local)
            self.stored = {path: self._stamp(path) for path in self._files()}

    def checkpoint_location(self, ckpt: Path) -> str:
        return storage.join(self.location, "checkpoints", ckpt.name) if self.remote else str(ckpt)

    def clear(self) -> None:
        """--overwrite: the stored run goes before the new one is written."""
        if self.remote:
            self.store.delete("")

    def publish(self) -> None:
        """Upload the run's new or changed files (metrics, config, W&B) from the staging copy; checkpoints are
        not among them (workers and the server write those to the store themselves)."""
        if self.remote:
            for path in self._files():
                if self.stored.get(path) != self._stamp(path):
                    self.stored[path] = self._stamp(path)
                    self.store.upload(path, path.relative_to(self.local).as_posix())

    def _files(self) -> list[Path]:
        return sorted(p for p in self.local.rglob("*") if p.is_file() and p.relative_to(self.local).parts[0] != "checkpoints")

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int]:
        stat = path.stat()
        return stat.st_mtime_ns, stat.st_size

    def close(self) -> None:
        if self.remote:
            storage.remove_staging(self.local)


def run(cfg: RunConfig, overwrite: bool = False, on_round: RoundCallback | None = None,
        resume: bool = False, on_start: Callable[[int], None] | None = None) -> RunResult:
    """Run (or with ``resume``, continue) a simulation. ``on_start(rounds_already_done)`` is called once the
    inputs are validated and training begins; ``on_round(row, result)`` after every completed round.
    Bad input raises ConfigError/DataError/CheckpointError before anything is written; a failure once the
    run is under way raises RunFailed (with the resume command)."""
    # Every input is checked before Ray starts or a file is written.
    data, partition, init_weights = prepare_inputs(cfg)
    folder = RunFolder(cfg)
    try:
        ckpt = None
        if not folder.remote:
            runlock.refuse_if_live(folder.local)
        if resume:
            folder.fetch()
            _refuse_changed_data(folder.local, data)
            ckpt = _checked_checkpoint(cfg, folder.local, data, init_weights)
            partition = Partition.load(folder.local / "partition.npz")
        else:
            folder.refuse_existing(overwrite)
        connect_ray(cfg)
        if not os.environ.get("RAY_ADDRESS"):
            check_resources(cfg)  # a Ray started here has no autoscaler: what it lacks now, it lacks for good
        workers = min(cfg.engine.workers, partition.num_clients)
        group = placement.reserve(cfg, workers)
        try:
            if not folder.remote:
                placement.check_shared(folder.local.parent, placement.nodes_of(group), cfg.engine.round_timeout_s)
            # Held until the run ends: a second run of this folder, or --overwrite meanwhile, is refused. An
            # object store has no such lock: there the staging copy is private to this process anyway.
            with contextlib.nullcontext() if folder.remote else runlock.hold(folder.local):
                if not resume:
                    folder.refuse_existing(overwrite)  # again: another run may have filled the folder meanwhile
                    _create(folder, cfg, partition, data)
                bundles = placement.bundles(group, workers)
                try:
                    if resume:
                        _write_config(folder.local, cfg)  # an extended train.rounds is remembered
                    return _train(cfg, folder, partition, data, init_weights, bundles, ckpt, resume, on_round, on_start)
                except (ConfigError, DataError, checkpoint.CheckpointError, TrainingDiverged):
                    raise
                except Exception as err:
                    raise RunFailed(describe_failure(err), folder.location) from err
        finally:
            placement.release(group)
    finally:
        folder.close()


def _create(folder: RunFolder, cfg: RunConfig, partition: Partition, data: ArrayDataset) -> None:
    """Write the new run's folder. Failing here (a full disk) is a run-time failure, but there is nothing to
    resume yet: the folder has no config.yaml, and the way on is to start again."""
    try:
        folder.clear()
        _start_new(folder.local, cfg, partition, data)
        folder.publish()
    except OSError as err:
        raise RunFailed(describe_failure(err), folder.location, resumable=False) from err


def describe_failure(err: BaseException) -> str:
    """One line for what broke, without the traceback Ray wraps around a remote error."""
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    if isinstance(err, RayTaskError) and isinstance(err.cause, RayActorError):  # raised in the server
        lines = [ln for ln in str(err.cause).splitlines() if ln.strip()]
        return f"a worker failed to start or died ({lines[-1].strip()[:200] if lines else 'no message'})"
    if isinstance(err, RayTaskError) and isinstance(err.cause, GetTimeoutError):  # the server's, naming a worker
        return str(err.cause).splitlines()[0]
    if isinstance(err, RayTaskError) and err.cause is not None and err.cause is not err:
        return describe_failure(err.cause)
    if isinstance(err, RayActorError):
        return "the server actor died (its process was killed or ran out of memory)"
    if isinstance(err, GetTimeoutError):
        return "no answer within engine.round_timeout_s"
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}{f' ({err.filename})' if err.filename else ''}"
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else 'no message'}"


SERVER_MARGIN_S = 60  # entrypoint waits on the server this much longer than the server waits on workers


def _checked_checkpoint(cfg: RunConfig, run_dir: Path, data: ArrayDataset, init_weights: dict | None) -> Path | None:
    """The checkpoint a resume starts from (validated against this config), None for round 0."""
    ckpt = checkpoint.latest(run_dir)
    if ckpt is not None:
        layout, _ = shared_layout(cfg, data.num_classes, data.input_shape, init_weights)
        checkpoint.read_state(ckpt, checkpoint.fingerprint(cfg.model_dump()), layout.size)
    return ckpt


def _train(cfg: RunConfig, folder: RunFolder, partition: Partition, data: ArrayDataset, init_weights: dict | None,
           bundles: list, ckpt: Path | None, resume: bool, on_round: RoundCallback | None,
           on_start: Callable[[int], None] | None) -> RunResult:
    run_dir = folder.local
    started = time.perf_counter()
    server = start_engine(cfg, partition, data, bundles, init_weights)
    # The server's own deadline for its workers comes first, and its error names the silent worker.
    timeout = cfg.engine.round_timeout_s + SERVER_MARGIN_S
    logger = RunLogger(run_dir, _sink(cfg, run_dir, resume))
    summary = None
    try:
        done = ray.get(server.restore.remote(folder.checkpoint_location(ckpt) if ckpt else None), timeout=timeout)
        logger.truncate(done)
        if on_start:
            on_start(done)
        round_idx = done + 1
        while round_idx <= cfg.train.rounds:
            result = ray.get(server.round.remote(round_idx), timeout=timeout)
            if isinstance(result, RoundFailed):
                raise TrainingDiverged(result.error)
            if isinstance(result, RolledBack):  # a worker died: redo everything since the last checkpoint
                logger.truncate(result.to_round)
                round_idx = result.to_round + 1
                continue
            row = logger.log_round(result)
            every = cfg.engine.checkpoint_every
            if every and (round_idx % every == 0 or round_idx == cfg.train.rounds):
                logger.sync()  # metrics first: a published checkpoint never points past what is on disk
                folder.publish()
                saved = ray.get(server.checkpoint.remote(folder.location if folder.remote else str(run_dir), round_idx),
                                timeout=timeout)
                if isinstance(saved, RolledBack):  # a worker died while writing its part
                    logger.truncate(saved.to_round)
                    round_idx = saved.to_round + 1
                    continue
            if on_round:
                on_round(row, result)
            round_idx += 1
        workers = ray.get(server.worker_info.remote(), timeout=timeout)
        save_final_model(run_dir, cfg, data, ray.get(server.global_weights.remote(), timeout=timeout))
        summary = _summary(cfg, logger, workers, time.perf_counter() - started)
        if logger.sink:
            summary["wandb"] = logger.sink.describe(run_dir, folder.location)
        atomic.write_text(run_dir / "summary.json", json.dumps(summary, indent=1))
    finally:
        logger.close(summary)
        folder.publish()  # also after a failure: the metrics so far and the W&B run's final state
        _stop(server)
    return RunResult(cfg.name, folder.location if folder.remote else run_dir, summary)


def _stop(server) -> None:
    """Stop the server and its workers; a server that already died must not hide why the run ended."""
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        ray.get(server.shutdown.remote(), timeout=60)
    except (RayActorError, GetTimeoutError):
        pass  # the workers belong to this process and end with its Ray connection
    ray.kill(server)


def _summary(cfg: RunConfig, logger: RunLogger, workers: list[dict], wall: float) -> dict:
    records = logger.records_of_round(cfg.train.rounds)
    summary = {"name": cfg.name, "algorithm": cfg.algorithm.name, "rounds": cfg.train.rounds,
               "never_sampled": sum(r.get("times_sampled") == 0 for r in records)}
    for key in ("acc", "acc_personalized"):
        if records and key in records[0]:
            per_client = {r["client"]: r[key] for r in records}
            summary[key] = summarize(list(per_client.values()))
            summary[f"per_client_{key}"] = per_client
    summary.update(comm=logger.comm_totals(), wall_seconds=wall, workers=workers)
    return summary
