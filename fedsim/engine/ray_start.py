"""Starting Ray (or attaching to a cluster) with a bounded wait that Ctrl-C and SIGTERM can end at any moment, and
shutting it down with whatever a local Ray leaves (``ray_footprint``).

Measured (Ray 2.60): ``ray.init`` blocks in C code that never returns to Python while it waits (asked for 1e9 CPUs,
forever), so a signal handler of the main thread never runs there; and on SIGTERM the C++ crash handler it
installs printed a stack dump. Here ``ray.init`` runs in a thread of its own while the main thread waits, where
signal handlers run. That thread then lives as long as the Ray it started: Ray binds its GCS and raylet to the
thread that started them (Linux's PR_SET_PDEATHSIG), and they were killed when it ended."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ray

from fedsim.engine.ray_footprint import GRACE_S, Footprint, ray_temp_root
from fedsim.errors import RayUnavailable

RAY_START_TIMEOUT_S = 300.0
"""How long starting a local Ray, or attaching to a cluster, may take before fedsim gives up with one line. Measured
on a loaded 2-core machine: a local start takes 5-30 s; Ray's own waits inside (the GCS and the raylet coming up,
a cluster's GCS answering) each give up within 60 s, except the driver's registration with a raylet that cannot
serve it (``num_cpus`` of 1e9: forever)."""

# Ray's warning when ray.init runs outside the main thread: fedsim keeps its own SIGTERM handler on purpose.
_NOT_MAIN_THREAD = "SIGTERM handler is not set because current thread is not the main thread"


@dataclass
class _Started:
    """A Ray this process started or attached to: the thread that did it (kept until ``release`` is set) and,
    for a local one, what it leaves on the machine."""

    release: threading.Event
    footprint: Footprint | None


_STARTED: list[_Started] = []
_STUCK: list[threading.Thread] = []  # given-up starts' threads still inside Ray's C++ client after GRACE_S


def start_within(init: Callable[[], object], what: str, footprint: Footprint | None = None,
                 timeout_s: float | None = None) -> None:
    """``init()`` (a ``ray.init``) in a thread of its own while this one waits at most RAY_START_TIMEOUT_S (or
    ``timeout_s``); Ctrl-C and SIGTERM raise here during the wait. Ray's crash handler is kept off in this process
    while Ray starts (the workers keep theirs). On a timeout, a signal or a failed start, the processes and session
    folder of the start (``footprint``) are removed; a timeout raises RayUnavailable naming ``what``."""
    from ray._private import ray_constants

    limit = RAY_START_TIMEOUT_S if timeout_s is None else timeout_s
    outcome: list[BaseException | None] = []
    started = _Started(threading.Event(), footprint)

    def run() -> None:
        try:
            init()
        except BaseException as err:  # handed to the waiting thread, which raises it
            outcome.append(err)
            return
        outcome.append(None)
        started.release.wait()  # Ray's GCS and raylet end with this thread

    handler = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # read by ray.init when it makes the driver's worker
    thread = threading.Thread(target=run, name="fedsim-ray", daemon=True)
    try:
        with _ray_log_without(_NOT_MAIN_THREAD):
            thread.start()
            _wait_for(outcome, limit)
        if not outcome:
            raise RayUnavailable(f"Ray did not start within {limit:g} s ({what}); check `ray status` and the "
                                 f"logs under {ray_temp_root()}, or set RAY_ADDRESS to a cluster that is up")
        if outcome[0] is not None:
            raise outcome[0]
    except BaseException:
        _abandon(thread, started)
        raise
    finally:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = handler
    _STARTED.append(started)


def _wait_for(outcome: list[BaseException | None], limit: float) -> None:
    """Until the start's thread put its outcome, at most ``limit`` s; a signal handler runs between the short
    sleeps (and its exception ends the wait)."""
    deadline = time.monotonic() + limit
    while not outcome and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_ray() -> None:
    """Shut Ray down; a local Ray this process started is removed with everything it left (``Footprint``)."""
    if not _STARTED:
        ray.shutdown()
        return
    started = _STARTED.pop()
    if started.footprint is None:
        ray.shutdown()
    else:
        started.footprint.remove(ray.shutdown)
    started.release.set()


def start_still_inside_ray() -> bool:
    """Whether the thread of a start that was given up is still inside Ray's C++ client."""
    return any(thread.is_alive() for thread in _STUCK)


def _abandon(thread: threading.Thread, started: _Started) -> None:
    """End what a start that is given up left. The start's thread may still be inside Ray's C++ client, which
    logs each failure it meets as the GCS ends to this process's stderr (file descriptor 2): muted while the start
    is ended and its thread given GRACE_S to finish, so the one line fedsim prints stays the only one. A thread
    still inside after that keeps descriptor 2 muted for good; Python's own output goes on through a copy of it."""
    sys.stderr.flush()
    terminal, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        if started.footprint is not None:
            started.footprint.remove()
        started.release.set()
        thread.join(GRACE_S)
    finally:
        if thread.is_alive():
            _STUCK.append(thread)
            sys.stderr = open(terminal, "w", buffering=1, errors="backslashreplace")
        else:
            os.dup2(terminal, 2)
            os.close(terminal)


@contextlib.contextmanager
def _ray_log_without(message: str) -> Iterator[None]:
    """Ray's Python log records that start with ``message`` dropped while inside."""
    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(message)

    handlers = logging.getLogger("ray").handlers
    for handler in handlers:
        handler.addFilter(keep)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(keep)
