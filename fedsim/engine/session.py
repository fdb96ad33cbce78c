"""One simulation from config to finished run folder: check the inputs, start (or attach to) Ray, reserve
the workers' resources, hold the run folder, start the server and workers, and drive the rounds."""
from __future__ import annotations

import math
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fedsim.config import RunConfig
from fedsim.core.checkpoint import CheckpointError
from fedsim.engine import placement
from fedsim.engine.driver import Callback, Run, drive, end
from fedsim.engine.failures import TrainingDiverged, describe_failure
from fedsim.engine.runfolder import RunFolder
from fedsim.engine.server import ServerActor
from fedsim.errors import ConfigError, DataError, RunFailed, UserCodeError, user_error
from fedsim.plan import RunPlan
from fedsim.plan.build import build_plan, load_inputs

WorkerSpawn = Callable[[ray.ObjectRef, dict, Any, float, float], Any]
"""``spawn(plan_ref, clients, bundle, cpus, gpus)``: one worker actor (``fedsim.client.worker.spawn_worker``)."""


def connect_ray(cfg: RunConfig, cpus: float | None = None) -> None:
    """Attach to a cluster when RAY_ADDRESS is set, else start a local Ray sized for the workers (or for
    ``cpus``: what several runs at once need). The Ray token file is kept private before Ray starts and after
    (Ray writes a new one with the process's umask)."""
    if ray.is_initialized():
        return
    private_token()
    quiet = {"log_to_driver": True, "configure_logging": True, "logging_level": "warning"}
    # ray.init installs a C-level SIGTERM handler that dumps a trace and aborts (exit 134); a handler the caller
    # set (the CLI's: SIGTERM unwinds the run like Ctrl-C) is put back.
    main = threading.current_thread() is threading.main_thread()
    on_term = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], **quiet)
            return
        refuse_stale_ray_settings()
        engine = cfg.engine
        need = engine.workers * engine.cpus_per_worker if cpus is None else cpus
        cpus = max(os.cpu_count() or 1, math.ceil(need - 1e-9))
        # The dashboard stays on loopback unless a user binds it elsewhere on purpose.
        # address="local": always a fresh local instance, never a stray cluster left behind by `ray start`.
        ray.init(address="local", num_cpus=cpus, include_dashboard=engine.dashboard, dashboard_host="127.0.0.1", **quiet)
    finally:
        if callable(on_term):
            signal.signal(signal.SIGTERM, on_term)
        private_token()


def refuse_stale_ray_settings() -> None:
    """Ray reads its loopback and token settings when it is imported (``fedsim/__init__.py`` sets them). Where
    ``ray`` was imported first, it read them without: the cluster it starts would listen on the network address,
    and its token-checking processes would refuse this process (Ray retries for a minute, then raises an
    AuthenticationError that names neither cause). Refused in one line instead."""
    from ray._common.utils import env_bool
    from ray._private import ray_constants
    from ray._raylet import AuthenticationMode, get_authentication_mode

    network = env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX)
    mode = os.environ.get("RAY_AUTH_MODE")  # unset: ray.init picks the mode itself, nothing to compare
    token = get_authentication_mode() == AuthenticationMode.TOKEN
    if ray_constants.ENABLE_RAY_CLUSTER != network or (mode is not None and token != (mode.lower() == "token")):
        raise ConfigError("ray was imported before fedsim, so the local Ray cluster would miss fedsim's settings "
                          "(ports on loopback, token authentication); import fedsim before ray, or export "
                          "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=token before Python starts")


def token_path() -> Path:
    """Where Ray keeps the token of a cluster this process starts or joins (RAY_AUTH_TOKEN_PATH, else ~/.ray)."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()


def private_token() -> None:
    """The token lets whoever reads it attach to the cluster and submit jobs: its folder 0700, the file 0600.
    Ray creates both with the umask (0755 / 0644 under umask 022, readable by every local account). Ours are
    repaired; a token or folder of another account that others can read is refused with one line."""
    path = token_path()
    for target, mode in ((path.parent, 0o700), (path, 0o600)):
        if not target.exists():
            continue
        info = target.stat()
        if info.st_mode & 0o077 == 0:
            continue
        if info.st_uid != os.getuid():
            raise ConfigError(f"{target}: the Ray token{' folder' if target.is_dir() else ''} belongs to another account "
                              f"and others can read it (mode {info.st_mode & 0o777:o}); set RAY_AUTH_TOKEN_PATH to a "
                              "private file of your own")
        target.chmod(mode)


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


def _this_node() -> NodeAffinitySchedulingStrategy:
    # The server actor stays on the submitting node so it shares that node's view of the run folder.
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def start_engine(plan: RunPlan, refs: tuple[ray.ObjectRef, ray.ObjectRef], spawn: WorkerSpawn, bundles: list):
    """Spawn the workers (worker i in ``bundles[i]``) and the server actor together (the workers' ~3 s of
    imports overlap the server's start-up instead of following it). ``refs``: the plan and its workers' copy
    (``plan.for_workers()``) in Ray's object store, held by the caller for the whole run. Returns the
    server's handle."""
    plan_ref, worker_plan_ref = refs
    engine = plan.cfg.engine

    def spawn_one(clients, bundle):
        return spawn(worker_plan_ref, clients, bundle, engine.cpus_per_worker, engine.gpus_per_worker)

    workers = [spawn_one(clients, bundle) for clients, bundle in zip(plan.assignments, bundles)]
    return ServerActor.options(num_cpus=0, scheduling_strategy=_this_node()).remote(plan_ref, workers, spawn_one,
                                                                                     bundles)


def run_session(cfg: RunConfig, spawn: WorkerSpawn, callbacks: Sequence[Callback], overwrite: bool = False,
                resume: bool = False, reserved: PlacementGroup | None = None) -> Run:
    """Run (or with ``resume``, continue) a simulation, telling ``callbacks`` as it goes; ``spawn(plan, clients,
    bundle)`` starts one worker actor. ``reserved``: a placement group the caller holds with one bundle per worker
    (a Ray Tune trial's), used instead of reserving one. Bad input raises ConfigError/DataError/CheckpointError
    before anything is written; a failure once the run is under way raises RunFailed (with the resume command)."""
    inputs = load_inputs(cfg)  # every input is checked before Ray starts or a file is written
    folder = RunFolder(cfg)
    try:
        folder.refuse_live()
        partition, ckpt = folder.open_for_resume(inputs.data) if resume else (inputs.partition, None)
        if not resume:
            folder.refuse_existing(overwrite)
        plan = build_plan(cfg, inputs, partition)
        folder.check_checkpoint(ckpt, plan)
        _, notice = plan.packing
        if notice:
            print(notice, file=sys.stderr, flush=True)
        connect_ray(cfg)
        if not os.environ.get("RAY_ADDRESS"):
            check_resources(cfg)  # a Ray started here has no autoscaler: what it lacks now, it lacks for good
        group = reserved or placement.reserve(cfg, plan.workers)
        try:
            if not folder.remote:
                placement.check_shared(folder.local.parent, placement.nodes_of(group), cfg.engine.round_timeout_s)
            with folder.lock():
                if resume:
                    folder.write_config()  # an extended train.rounds is remembered
                else:
                    folder.refuse_existing(overwrite)  # again: another run may have filled the folder meanwhile
                    folder.create(partition, inputs.data)
                try:
                    return _train(plan, folder, spawn, placement.bundles(group, plan.workers), ckpt, resume, callbacks)
                except (ConfigError, DataError, CheckpointError, TrainingDiverged):
                    raise
                except Exception as err:
                    interrupt = _interrupt_behind(err)
                    if interrupt is not None:  # Ctrl-C or SIGTERM that landed inside a C call (a SystemError)
                        raise interrupt from None
                    mistake = user_error(err)  # the user's module raised: their error, once, never a lost worker
                    if mistake is not None:
                        raise UserCodeError(f"{mistake}, then continue with `fedsim run --resume "
                                            f"{shlex.quote(str(folder.location))}`") from None
                    raise RunFailed(describe_failure(err), folder.location) from err
        finally:
            if reserved is None:
                placement.release(group)
    finally:
        folder.close()


def _train(plan: RunPlan, folder: RunFolder, spawn: WorkerSpawn, bundles: list, ckpt: Path | None, resume: bool,
           callbacks: Sequence[Callback]) -> Run:
    started = time.perf_counter()
    refs = ray.put(plan), ray.put(plan.for_workers())  # one copy each in the object store: the server's, the workers'
    run = Run(plan, folder, resume, start_engine(plan, refs, spawn, bundles), started, callbacks=list(callbacks))
    error: BaseException | None = None
    try:
        drive(run, folder.checkpoint_location(ckpt) if ckpt else None)
    except BaseException as err:
        error = err
        raise
    finally:
        try:
            end(run, error)
        finally:
            _stop(run.server)
    return run


def _stop(server) -> None:
    """Stop the server and its workers; a server that already died must not hide why the run ended."""
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        ray.get(server.shutdown.remote(), timeout=60)
    except (RayActorError, GetTimeoutError):
        pass  # the workers belong to this process and end with its Ray connection
    ray.kill(server)


def _interrupt_behind(err: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM (a BaseException that is no Exception) behind ``err``, if any: a signal handler that
    raises while C code runs comes back wrapped, as "SystemError: ... returned a result with an exception set"."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if not isinstance(err, Exception):
            return err
        err = err.__cause__ or err.__context__
    return None
