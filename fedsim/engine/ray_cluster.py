"""Ray for a run: attaching to a cluster or starting a local one sized for the workers (``ray_start``: a bounded
wait), with its token file kept private; refusing workers this machine (local) or the cluster cannot hold;
pinning an actor to this node."""
from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fedsim import storage
from fedsim.config import RunConfig
from fedsim.engine.ray_footprint import Footprint
from fedsim.engine.ray_start import start_within
from fedsim.errors import ConfigError
from fedsim.plan import worker_count


class _RayLogging(TypedDict):
    """ray.init's logging settings for every run: warnings and above, the workers' output shown here."""

    log_to_driver: bool
    configure_logging: bool
    logging_level: int


WORKER_MEMORY_FLOOR_MB = 256
"""The least memory one worker process takes: measured, a worker of the smallest run (an MLP on synthetic data) holds
~400 MB of its own (USS) once torch and Lightning are loaded, an idle Ray worker ~60 MB."""


def connect_ray(cfg: RunConfig, cpus: float | None = None) -> None:
    """Attach to a cluster when RAY_ADDRESS is set, else start a local Ray sized for the workers (or for
    ``cpus``: what several runs at once need), once the workers are known to fit this machine. Either waits at
    most RAY_START_TIMEOUT_S. The Ray token file is kept private before Ray starts and after (Ray writes a new
    one with the process's umask)."""
    if ray.is_initialized():
        return
    private_token()
    quiet: _RayLogging = {"log_to_driver": True, "configure_logging": True, "logging_level": logging.WARNING}
    try:
        address = os.environ.get("RAY_ADDRESS")
        if address:
            start_within(lambda: ray.init(address=address, runtime_env=run_environment(), **quiet),
                         f"attaching to the Ray cluster at {address}")
            return
        refuse_stale_ray_settings()
        engine = cfg.engine
        refuse_beyond_this_machine(cfg)
        need = worker_count(cfg) * engine.cpus_per_worker if cpus is None else cpus
        cpus = max(os.cpu_count() or 1, math.ceil(need - 1e-9))
        # The dashboard stays on loopback unless a user binds it elsewhere on purpose.
        # address="local": always a fresh local instance, never a stray cluster left behind by `ray start`.
        start_local(lambda: ray.init(address="local", num_cpus=cpus, include_dashboard=engine.dashboard,
                                     dashboard_host="127.0.0.1", runtime_env=run_environment(), **quiet),
                    f"starting a local Ray with {cpus} CPUs")
    finally:
        private_token()


LOCAL_START_TRIES = 3
"""How many times a local start that Ray itself gave up is tried. Ray gives a new node's raylet a hard-coded 30 s
to register with the GCS (``ray/_private/node.py``, no setting reaches it); on this 2-core machine, loaded by two
long reproduction lanes and the test suite, a start missed it and the suite's lane ended (2026-12-05). Each try
is a fresh start: the failed one's processes and session folder are removed first (``start_within``)."""

NODE_START_TIMED_OUT = "The current node timed out during startup"
"""The start of the message Ray raises (as a bare Exception) when that 30 s wait runs out."""


def start_local(init: Callable[[], object], what: str) -> None:
    """``start_within`` for a local Ray, tried again (at most LOCAL_START_TRIES times in all, each try with the
    full RAY_START_TIMEOUT_S) when Ray's own node start-up wait ran out; every other failure is raised at once."""
    for attempt in range(1, LOCAL_START_TRIES + 1):
        try:
            start_within(init, what, Footprint())
            return
        except Exception as err:
            if attempt == LOCAL_START_TRIES or not str(err).startswith(NODE_START_TIMED_OUT):
                raise
            ray.shutdown()  # clears what the failed ray.init set in this process
            print(f"fedsim: Ray's node did not register within its 30 s ({what}, try {attempt} of "
                  f"{LOCAL_START_TRIES}); starting it again", file=sys.stderr, flush=True)


def refuse_beyond_this_machine(cfg: RunConfig) -> None:
    """A local run's workers all run on this machine: a worker that asks for more CPUs than it has, or more
    workers than its memory could hold at WORKER_MEMORY_FLOOR_MB each, can never run. Refused before Ray starts
    (asked for 1e9 CPUs, ``ray.init`` never returned)."""
    engine, workers = cfg.engine, worker_count(cfg)
    have_cpus = os.cpu_count() or 1
    if engine.cpus_per_worker > have_cpus:
        raise ConfigError(f"engine.cpus_per_worker: {engine.cpus_per_worker:g} CPUs per worker, this machine has "
                          f"{have_cpus}; give at most {have_cpus}, or set RAY_ADDRESS to a cluster with larger nodes")
    have_mb = psutil.virtual_memory().total / 2**20
    need_mb = workers * WORKER_MEMORY_FLOOR_MB
    if need_mb > have_mb:
        fit = max(1, int(have_mb // WORKER_MEMORY_FLOOR_MB))
        raise ConfigError(f"engine.workers: {workers} worker processes need at least {need_mb / 2**10:,.0f} GB of "
                          f"memory ({WORKER_MEMORY_FLOOR_MB} MB each), this machine has {have_mb / 2**10:,.0f} GB; "
                          f"give at most {fit} workers, or set RAY_ADDRESS to a cluster")


def run_environment() -> dict[str, Any]:
    """What every Ray process of the run (a sweep's trials, the workers) gets from this driver: the directory the
    user ran fedsim from, which a config's relative paths start from (``fedsim.storage.user_dir``), and this
    process's import path ahead of the one Ray gives it (:func:`imports_as_driver`)."""
    here = Path.cwd().resolve()
    # The driver's own folder is named as "the process's folder" (None): a job's working_dir is unpacked at another
    # path on each node, and each worker runs in its node's copy, which is what the driver imported from.
    paths = [None if Path(p or ".").resolve() == here else str(Path(p).resolve()) for p in sys.path]
    return {"env_vars": {storage.USER_DIR_ENV: str(storage.user_dir())},
            "worker_process_setup_hook": imports_as_driver(paths)}


def imports_as_driver(paths: list[str | None]) -> Callable[[], None]:
    """A Ray worker's set-up: top-level modules found along the driver's import path (``paths``) first. Ray puts
    the driver's working folder ahead of PYTHONPATH on every worker (after this hook runs, so editing sys.path here
    does not hold), where the ``fedsim`` command does not look: a folder holding another copy of fedsim (or of a
    plug-in) would have the workers run other code than the driver. A finder first on sys.meta_path looks a
    top-level module up in the driver's order (a submodule follows its package); the driver's own folder stands for
    the worker's, which under `ray job submit` is the job's working_dir as unpacked on the worker's node. A closure, so Ray sends it by
    value: unpickling it on the worker imports no fedsim (each worker then checks what it imported against the
    driver's files: ``fedsim.plugins.other_code``)."""
    def find_as_driver() -> None:
        import importlib.machinery
        import os as worker_os
        import sys as worker_sys

        # None: the driver's own folder, here the worker's (a job's working_dir as unpacked on this node).
        order = [worker_os.getcwd() if p is None else p for p in paths]

        class DriverOrder:
            @staticmethod
            def find_spec(name: str, path: object = None,
                          target: object = None) -> importlib.machinery.ModuleSpec | None:
                return None if path is not None else importlib.machinery.PathFinder.find_spec(name, order)

        worker_sys.meta_path.insert(0, DriverOrder)

    return find_as_driver


def refuse_stale_ray_settings() -> None:
    """Ray reads its loopback and token settings when it is imported (``fedsim/__init__.py`` sets them). Where
    ``ray`` was imported first, it read them without: the cluster it starts would listen on the network address,
    and its token-checking processes would refuse this process (Ray retries for a minute, then raises an
    AuthenticationError that names neither cause). Refused in one line instead."""
    from ray._common.utils import env_bool
    from ray._private import ray_constants
    # ray/_raylet.pyi, the stub of the compiled module, lists neither name; both exist in the module itself.
    from ray._raylet import AuthenticationMode, get_authentication_mode  # type: ignore[attr-defined]

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
    workers = worker_count(cfg)
    for resource, each in (("GPU", engine.gpus_per_worker), ("CPU", engine.cpus_per_worker)):
        need = workers * each
        if need > have.get(resource, 0) + 1e-9:
            field = "gpus_per_worker" if resource == "GPU" else "cpus_per_worker"
            raise ConfigError(f"engine.{field}: {workers} workers x {each} need {need:g} {resource}, the Ray cluster "
                              f"has {have.get(resource, 0):g}; lower engine.workers or engine.{field}")


def this_node() -> NodeAffinitySchedulingStrategy:
    """Scheduling on the node of this process: the server actor stays on the submitting node so it shares that
    node's view of the run folder."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
