"""The Ray actor shell of a worker (hosting many virtual clients), and the function that spawns one.

Kept free of torch: a process that receives an actor handle imports the module of the handle's class (the
server's, which respawns lost workers), so the actor class is this thin shell, and the torch side
(``ClientRuntime``, ~3 s of imports) is built inside the worker's own process."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import ray

from fedsim.core.protocol import ClientData, ClientRecord, FixedPointScales, WorkerPartial, WorkerReplies
from fedsim.errors import ConfigError, UserCodeError
from fedsim.plan import WorkerPlan
from fedsim.privacy.secagg import PairwiseMasks
from fedsim.plugins import other_code

T = TypeVar("T")


class Worker:
    """Ray actor hosting many virtual clients; every call goes to its ``ClientRuntime``."""

    def __init__(self, plan: WorkerPlan, clients: dict[int, ClientData]):
        from fedsim.client.runtime import ClientRuntime

        self.busy_cpu_s = 0.0  # this process's CPU time inside the round's calls (``cpu_seconds``)

        # The user's module failing to build is their error, told once by the first call: an actor whose
        # constructor raises would count as lost and be respawned (and fail) engine.max_recoveries times.
        self.failure: UserCodeError | None = None
        if (other := other_code(plan.code)) is not None:  # fedsim itself, before it builds anything
            self.failure = UserCodeError(other)
            return
        # Any exception, not only fedsim's own: an exception here is no lost worker (a replacement raises it again).
        try:
            self._runtime = ClientRuntime(plan, clients)
        except (UserCodeError, ConfigError) as err:
            self.failure = UserCodeError(str(err))
        except MemoryError:
            raise  # the machine's, not the user's: a lost worker, replaced (torch's OutOfMemoryError too, below)
        except Exception as err:
            if type(err).__name__ == "OutOfMemoryError":  # torch's (this module imports no torch)
                raise
            message = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
            self.failure = UserCodeError(f"model.client: setting up the client module on a worker raised "
                                         f"{type(err).__name__}: {message}; fix the module or its callbacks")
        if self.failure is None and (other := other_code(plan.code)) is not None:  # the plug-ins it imported
            self.failure = UserCodeError(other)

    @property
    def runtime(self):
        if self.failure is not None:
            raise self.failure
        return self._runtime

    def _timed(self, call: Callable[[], T]) -> T:
        """``call()``, its CPU time added to ``busy_cpu_s``: the whole process's (its threads' too), so a client
        module's own threads count; a worker is one process per Ray actor, so no other run's work is in it."""
        started = time.process_time()
        try:
            return call()
        finally:
            self.busy_cpu_s += time.process_time() - started

    def train_and_sum(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int,
                      scaling: FixedPointScales, masks: PairwiseMasks | None = None) -> WorkerPartial:
        return self._timed(lambda: self.runtime.train_and_sum(broadcast, clients, round_idx, scaling, masks))

    def train_and_reply(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> WorkerReplies:
        return self._timed(lambda: self.runtime.train_and_reply(broadcast, clients, round_idx))

    def evaluate(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> list[ClientRecord]:
        return self._timed(lambda: self.runtime.evaluate(broadcast, clients, round_idx))

    def save_state(self, target: str, full: bool = True) -> str:
        return self.runtime.save_state(target, full)

    def load_state(self, ckpt: str | None) -> None:
        self.runtime.load_state(ckpt)

    def device_info(self) -> dict:
        return self.runtime.device_info()

    @ray.method(concurrency_group="health")
    def ping(self) -> int:
        return os.getpid()  # answers even when the module failed to build: the worker itself is alive

    @ray.method(concurrency_group="health")
    def cpu_seconds(self) -> float:
        """The CPU time this worker has spent training and evaluating since it started (not its start-up)."""
        return self.busy_cpu_s


# Pings run on a thread of their own, so a worker busy training still answers them (the server tells
# busy from frozen that way); every other call stays on the one default thread, in order.
# ray.remote's typed overloads list task options only; concurrency_groups is an actor option it takes all the same.
WorkerActor = ray.remote(concurrency_groups={"health": 1})(Worker)  # type: ignore[call-overload]


def spawn_worker(plan: WorkerPlan | ray.ObjectRef, clients: dict[int, ClientData], bundle="SPREAD", cpus: float = 1,
                 gpus: float = 0):
    """One worker actor hosting ``clients`` at ``cpus``/``gpus`` (engine.cpus_per_worker, gpus_per_worker),
    scheduled by ``bundle`` (its bundle of the run's placement group). ``plan``: the run's plan, best as one
    object in Ray's store shared by every worker. torch's thread count is set by the runtime itself: a
    per-actor runtime_env would cost a fresh process (~0.6 s) instead of a prestarted one."""
    return WorkerActor.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=bundle).remote(plan, clients)
