"""Where a run's server and workers live, chosen once per run (engine.backend): ``RayBackend``, actors in Ray (parallel
and cluster runs), or ``LocalBackend``, the same Server and Worker objects in the driver's own process (one worker, no
Ray start-up, and a ``breakpoint()`` in a client module stops in the user's terminal).

The server, its pool and the driver loop talk to workers only through ``Calls`` (put, get, wait, kill) and handles
whose methods are called as ``handle.method.remote(...)``; a local handle runs the call at once and its answer stands
in for Ray's ObjectRef. Nothing else in the engine asks which backend it runs on."""
from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedsim.core.protocol import ClientData
from fedsim.engine.pool import Bundle, Calls, Handle, Ref

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from fedsim.config import RunConfig
    from fedsim.engine.runfolder import RunFolder
    from fedsim.plan import RunPlan, WorkerPlan


class RayCalls:
    """Ray's own functions (the server actor holds one: a plain object, pickled with it)."""

    in_this_process = False  # actors are processes of their own

    def put(self, value: Any) -> Ref:
        import ray

        return ray.put(value)

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        import ray

        return ray.get(refs, timeout=timeout)

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Ref], list[Ref]]:
        import ray

        return ray.wait(refs, num_returns=num_returns, timeout=timeout)

    def kill(self, handle: Handle) -> None:
        import ray

        ray.kill(handle)


class InProcessCalls:
    """Calls on in-process handles: every call has already run, so its answer is its own ref and always ready."""

    in_this_process = True

    def put(self, value: Any) -> Ref:
        return value

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        return refs

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Ref], list[Ref]]:
        return list(refs), []

    def kill(self, handle: Handle) -> None:
        pass  # an object in this process: it goes when its last reference does


class _Call:
    def __init__(self, method: Callable[..., Any]):
        self.remote = method  # runs at once; the answer stands in for the ObjectRef


class InProcess:
    """An object whose methods are called as an actor's (``handle.evaluate.remote(...)``), at once in this process."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> _Call:
        return _Call(getattr(self.target, name))


@dataclass(frozen=True)
class Workers:
    """How the client layer makes a worker (the engine imports none of it): ``actor(plan_ref, clients, bundle, cpus,
    gpus)`` starts a Ray actor (``fedsim.client.worker.spawn_worker``), ``in_process(plan, clients)`` builds the same
    worker in this process (``fedsim.client.worker.Worker``)."""
    actor: Callable[[Ref, dict[int, ClientData], Bundle, float, float], Handle]
    in_process: Callable[[WorkerPlan, dict[int, ClientData]], Any]


class Backend:
    """One run's place: reserve what its workers need, start the server with them, stop it."""
    calls: Calls

    @contextmanager
    def reserved(self, cfg: RunConfig, plan: RunPlan, folder: RunFolder,
                 group: PlacementGroup | None) -> Iterator[list[Bundle]]:
        """The workers' bundles, one each, held while the block runs."""
        raise NotImplementedError

    def start(self, plan: RunPlan, workers: Workers, bundles: list[Bundle]) -> Handle:
        """The server's handle, its workers started."""
        raise NotImplementedError

    def stop(self, server: Handle) -> None:
        """Stop the server and its workers; a server that already died must not hide why the run ended."""
        raise NotImplementedError


class RayBackend(Backend):
    """Server and workers as Ray actors, in the run's placement group (one bundle per worker)."""
    calls = RayCalls()

    def __init__(self) -> None:
        self.refs: tuple[Ref, Ref] | None = None  # the plans in Ray's object store, held for the whole run

    @contextmanager
    def reserved(self, cfg: RunConfig, plan: RunPlan, folder: RunFolder,
                 group: PlacementGroup | None) -> Iterator[list[Bundle]]:
        from fedsim.engine import placement
        from fedsim.engine.ray_cluster import check_resources, connect_ray
        from fedsim.engine.runfolder import LocalFolder

        connect_ray(cfg)
        if not os.environ.get("RAY_ADDRESS"):
            check_resources(cfg)  # a Ray started here has no autoscaler: what it lacks now, it lacks for good
        held = group or placement.reserve(cfg, plan.workers)
        try:
            if isinstance(folder.backend, LocalFolder):  # a bucket is every node's alike
                placement.check_shared(folder.local.parent, placement.nodes_of(held), cfg.engine.round_timeout_s)
            yield placement.bundles(held, plan.workers)
        finally:
            if group is None:
                placement.release(held)

    def start(self, plan: RunPlan, workers: Workers, bundles: list[Bundle]) -> Handle:
        import ray

        self.refs = ray.put(plan), ray.put(plan.for_workers())  # one copy each: the server's, the workers'
        return start_engine(plan, self.refs, workers.actor, bundles)

    def stop(self, server: Handle) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            ray.get(server.shutdown.remote(), timeout=60)
        except (RayActorError, GetTimeoutError):
            pass  # the workers belong to this process and end with its Ray connection
        ray.kill(server)


def start_engine(plan: RunPlan, refs: tuple[Ref, Ref], spawn: Callable[..., Handle], bundles: list[Bundle]) -> Handle:
    """Spawn the workers (worker i in ``bundles[i]``) and the server actor together (the workers' ~3 s of
    imports overlap the server's start-up instead of following it). ``refs``: the plan and its workers' copy
    (``plan.for_workers()``) in Ray's object store, held by the caller for the whole run. Returns the
    server's handle."""
    from fedsim.engine.ray_cluster import this_node
    from fedsim.engine.server import ServerActor

    plan_ref, worker_plan_ref = refs
    engine = plan.cfg.engine

    def spawn_one(clients: dict[int, ClientData], bundle: Bundle) -> Handle:
        return spawn(worker_plan_ref, clients, bundle, engine.cpus_per_worker, engine.gpus_per_worker)

    started = [spawn_one(clients, bundle) for clients, bundle in zip(plan.assignments, bundles)]
    return ServerActor.options(num_cpus=0, scheduling_strategy=this_node()).remote(plan_ref, started, spawn_one,
                                                                                   bundles, RayCalls())


class LocalBackend(Backend):
    """Server and workers in this process: no Ray, no placement; calls run one after another, as one worker's do."""
    calls = InProcessCalls()

    @contextmanager
    def reserved(self, cfg: RunConfig, plan: RunPlan, folder: RunFolder,
                 group: PlacementGroup | None) -> Iterator[list[Bundle]]:
        yield [None] * plan.workers

    def start(self, plan: RunPlan, workers: Workers, bundles: list[Bundle]) -> Handle:
        from fedsim.engine.server import Server

        # A copy, as each Ray worker gets its own: nothing a worker changes reaches the server's plan.
        worker_plan = copy.deepcopy(plan.for_workers())

        def spawn(clients: dict[int, ClientData], bundle: Bundle) -> Handle:
            return InProcess(workers.in_process(worker_plan, clients))

        started = [spawn(clients, bundle) for clients, bundle in zip(plan.assignments, bundles)]
        return InProcess(Server(plan, started, spawn, bundles, self.calls))

    def stop(self, server: Handle) -> None:
        server.shutdown.remote()


def backend_for(cfg: RunConfig) -> Backend:
    """engine.backend's engine, chosen once per run."""
    return LocalBackend() if cfg.engine.backend == "local" else RayBackend()
