"""One simulation from config to finished run folder: check the inputs and the run folder, start (or attach to)
Ray (``ray_cluster``), reserve the workers' resources, hold the run folder, start the server and workers, and
drive the rounds."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup

from fedsim.algorithms import batchnorm_notice
from fedsim.config import RunConfig
from fedsim.engine import placement
from fedsim.engine.driver import Callback, Run, drive, end
from fedsim.engine.failures import describe_failure
from fedsim.engine.pool import Bundle, Handle, Ref
from fedsim.engine.preflight import Rehearse, prepared
from fedsim.engine.ray_cluster import check_resources, connect_ray, this_node
from fedsim.engine.runfolder import LocalFolder, RunFolder
from fedsim.engine.server import ServerActor
from fedsim.errors import (CheckpointError, ConfigError, DataError, RunFailed, TrainingDiverged, UserCodeFailed,
                           user_error)
from fedsim.core.protocol import ClientData
from fedsim.plan import RunPlan

WorkerSpawn = Callable[[Ref, dict[int, ClientData], Bundle, float, float], Handle]
"""``spawn(plan_ref, clients, bundle, cpus, gpus)``: one worker actor (``fedsim.client.worker.spawn_worker``)."""


def start_engine(plan: RunPlan, refs: tuple[Ref, Ref], spawn: WorkerSpawn, bundles: list[Bundle]) -> Handle:
    """Spawn the workers (worker i in ``bundles[i]``) and the server actor together (the workers' ~3 s of
    imports overlap the server's start-up instead of following it). ``refs``: the plan and its workers' copy
    (``plan.for_workers()``) in Ray's object store, held by the caller for the whole run. Returns the
    server's handle."""
    plan_ref, worker_plan_ref = refs
    engine = plan.cfg.engine

    def spawn_one(clients: dict[int, ClientData], bundle: Bundle) -> Handle:
        return spawn(worker_plan_ref, clients, bundle, engine.cpus_per_worker, engine.gpus_per_worker)

    workers = [spawn_one(clients, bundle) for clients, bundle in zip(plan.assignments, bundles)]
    return ServerActor.options(num_cpus=0, scheduling_strategy=this_node()).remote(plan_ref, workers, spawn_one, bundles)


def run_session(cfg: RunConfig, spawn: WorkerSpawn, callbacks: Sequence[Callback], overwrite: bool = False,
                resume: bool = False, reserved: PlacementGroup | None = None, rehearse: Rehearse | None = None) -> Run:
    """Run (or with ``resume``, continue) a simulation, telling ``callbacks`` as it goes; ``spawn(plan, clients,
    bundle)`` starts one worker actor; ``rehearse(plan)``, when given, checks the client module before Ray starts.
    ``reserved``: a placement group the caller holds with one bundle per worker
    (a Ray Tune trial's), used instead of reserving one. Bad input raises ConfigError/DataError/CheckpointError
    before anything is written; a failure once the run is under way raises RunFailed (with the resume command)."""
    # Every input, the run folder and the module are checked before Ray starts or a file is written.
    with prepared(cfg, resume, overwrite, rehearse) as ready:
        inputs, folder, partition, ckpt, plan = ready.inputs, ready.folder, ready.partition, ready.checkpoint, ready.plan
        for notice in (plan.packing[1], batchnorm_notice(cfg, plan.algorithm, plan.model.keys)):
            if notice:
                print(notice, file=sys.stderr, flush=True)
        connect_ray(cfg)
        if not os.environ.get("RAY_ADDRESS"):
            check_resources(cfg)  # a Ray started here has no autoscaler: what it lacks now, it lacks for good
        group = reserved or placement.reserve(cfg, plan.workers)
        try:
            if isinstance(folder.backend, LocalFolder):  # a bucket is every node's alike
                placement.check_shared(folder.local.parent, placement.nodes_of(group), cfg.engine.round_timeout_s)
            with folder.held(inputs.data, partition, resume, overwrite), _failures_explained(folder):
                return _train(plan, folder, spawn, placement.bundles(group, plan.workers), ckpt, resume, callbacks)
        finally:
            if reserved is None:
                placement.release(group)


@contextmanager
def _failures_explained(folder: RunFolder) -> Iterator[None]:
    """A failure once the run is under way, as the user should see it: bad input and a diverged run as they are,
    an interrupt unwrapped, the user's own module's error once, anything else a RunFailed with the resume command."""
    try:
        yield
    except (ConfigError, DataError, CheckpointError, TrainingDiverged) as err:
        late = _raised_in_an_actor(err)
        if late is not None:  # one line, and what was written, instead of Ray's traceback of the actor
            raise type(late)(f"{late} (found once the run had started, in its folder {folder.location}: fix it, then "
                             f"`{folder.resume_command}`)") from None
        raise
    except Exception as err:
        interrupt = _interrupt_behind(err)
        if interrupt is not None:  # Ctrl-C or SIGTERM that landed inside a C call (a SystemError)
            raise interrupt from None
        mistake = user_error(err)  # the user's module raised: their error, once, never a lost worker
        if mistake is not None:  # the folder is written by now: exit 4, not bad input's 2 (nothing written)
            raise UserCodeFailed(f"{mistake}; {folder.location} keeps {folder.written()}: after the fix, continue "
                                 f"with `{folder.resume_command}`") from None
        raise RunFailed(describe_failure(err), folder.location, names_code=folder.names_code) from err


def _train(plan: RunPlan, folder: RunFolder, spawn: WorkerSpawn, bundles: list[Bundle], ckpt: Path | None, resume: bool,
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


def _stop(server: Handle) -> None:
    """Stop the server and its workers; a server that already died must not hide why the run ended."""
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        ray.get(server.shutdown.remote(), timeout=60)
    except (RayActorError, GetTimeoutError):
        pass  # the workers belong to this process and end with its Ray connection
    ray.kill(server)


def _raised_in_an_actor(err: BaseException) -> ConfigError | DataError | CheckpointError | None:
    """The bad-input error a worker or the server raised, inside the RayTaskErrors that carried it here, one for
    each actor it crossed (Ray's wrapper subclasses the error's class, so it is caught as one; its ``cause`` is
    what it wraps)."""
    cause: BaseException = err
    seen = set()
    while isinstance(getattr(cause, "cause", None), BaseException) and id(cause) not in seen:
        seen.add(id(cause))
        cause = getattr(cause, "cause")
    if cause is err or type(cause) not in (ConfigError, DataError, CheckpointError):
        return None
    assert isinstance(cause, (ConfigError, DataError, CheckpointError))
    return cause


def _interrupt_behind(err: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM (a BaseException that is no Exception) behind ``err``, if any: a signal handler that
    raises while C code runs comes back wrapped, as "SystemError: ... returned a result with an exception set"."""
    seen = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if not isinstance(link, Exception):
            return link
        link = link.__cause__ or link.__context__
    return None
