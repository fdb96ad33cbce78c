"""One simulation from config to finished run folder: check the inputs and the run folder, reserve the workers'
resources on the run's backend (``backend``: Ray's actors, or this process), hold the run folder, start the server
and workers, and drive the rounds."""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim.algorithms import batchnorm_notice
from fedsim.config import RunConfig
from fedsim.engine.backend import Backend, Workers, backend_for
from fedsim.engine.driver import Callback, Run, drive, end
from fedsim.engine.failures import describe_failure
from fedsim.engine.pool import Bundle
from fedsim.engine.preflight import Rehearse, prepared
from fedsim.engine.runfolder import RunFolder
from fedsim.errors import (CheckpointError, ConfigError, DataError, RunFailed, TrainingDiverged, UserCodeFailed,
                           user_error)
from fedsim.plan import RunPlan

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


def run_session(cfg: RunConfig, workers: Workers, callbacks: Sequence[Callback], overwrite: bool = False,
                resume: bool = False, reserved: PlacementGroup | None = None, rehearse: Rehearse | None = None) -> Run:
    """Run (or with ``resume``, continue) a simulation, telling ``callbacks`` as it goes; ``workers`` makes a worker
    on whichever backend engine.backend picks; ``rehearse(plan)``, when given, checks the client module before the
    engine starts. ``reserved``: a placement group the caller holds with one bundle per worker (a Ray Tune trial's),
    used instead of reserving one. Bad input raises ConfigError/DataError/CheckpointError before anything is
    written; a failure once the run is under way raises RunFailed (with the resume command)."""
    # Every input, the run folder and the module are checked before Ray starts or a file is written.
    with prepared(cfg, resume, overwrite, rehearse) as ready:
        inputs, folder, partition, ckpt, plan = ready.inputs, ready.folder, ready.partition, ready.checkpoint, ready.plan
        for notice in (plan.packing[1], batchnorm_notice(cfg, plan.algorithm, plan.model.keys)):
            if notice:
                print(notice, file=sys.stderr, flush=True)
        backend = backend_for(cfg)
        with backend.reserved(cfg, plan, folder, reserved) as bundles:
            with folder.held(inputs.data, partition, resume, overwrite), _failures_explained(folder):
                return _train(plan, folder, backend, workers, bundles, ckpt, resume, callbacks)


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


def _train(plan: RunPlan, folder: RunFolder, backend: Backend, workers: Workers, bundles: list[Bundle],
           ckpt: Path | None, resume: bool, callbacks: Sequence[Callback]) -> Run:
    started = time.perf_counter()
    server = backend.start(plan, workers, bundles)
    run = Run(plan, folder, resume, server, backend.calls, started, callbacks=list(callbacks))
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
            backend.stop(run.server)
    return run


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
