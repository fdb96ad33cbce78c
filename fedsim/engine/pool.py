"""The server's worker actors as one pool (as Flower keeps its Ray actors in ``VirtualClientEngineActorPool``, apart
from the strategy): their answers gathered under engine.round_timeout_s, a worker that stops answering pings killed
after engine.heartbeat_timeout_s, and a lost worker replaced, in its bundle with the same clients, at most
engine.max_recoveries times in a row. What a loss means for the run (a rollback to the last checkpoint) is the
server's to decide.

This module imports no torch (the server's process does not)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ray.exceptions import GetTimeoutError, RayActorError

from fedsim.core.protocol import ClientData

if TYPE_CHECKING:
    from fedsim.config import EngineConfig

PING_TIMEOUT_S = 60

Handle = Any
"""A Ray actor's handle: its remote methods are attributes Ray makes at run time, which no type can list."""
Ref = Any
"""A Ray ObjectRef of a call's answer (in-process tests hand the answer itself)."""
Bundle = Any
"""A worker's scheduling strategy: its bundle of the run's placement group, or Ray's "SPREAD"."""
Spawn = Callable[[dict[int, ClientData], Bundle], Handle]
"""``spawn(clients, bundle)``: a new worker actor hosting ``clients``, scheduled by ``bundle``."""


class Calls(Protocol):
    """What the server, its pool and the driver ask of the run's backend (``fedsim.engine.backend``), in Ray's words."""

    def put(self, value: Any) -> Ref: ...

    def get(self, refs: Any, timeout: float | None = None) -> Any: ...

    def wait(self, refs: list[Ref], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[Ref], list[Ref]]: ...

    def kill(self, handle: Handle) -> None: ...

    @property
    def in_this_process(self) -> bool:
        """Whether the workers run in the caller's own process (their CPU time is then already in its own)."""


class WorkerLost(RuntimeError):
    """A worker kept dying (or freezing) however often it was replaced: one line naming it and its clients."""


class WorkerPool:
    """``workers[i]`` hosts ``assignments[i]`` in ``bundles[i]``; ``spawn`` replaces one that is lost."""

    def __init__(self, workers: list[Handle], assignments: list[dict[int, ClientData]], spawn: Spawn,
                 bundles: list[Bundle] | None,
                 engine: EngineConfig, calls: Calls):
        self.calls = calls  # the backend's put/get/wait/kill
        self.workers = list(workers)
        self.assignments = assignments  # kept to respawn a lost worker with the same clients, in the same bundle
        self.spawn = spawn
        self.bundles = bundles or ["SPREAD"] * len(workers)
        self.engine = engine
        self.recoveries = 0
        self.losses_in_a_row = 0  # recoveries since a round last completed: bounded by engine.max_recoveries
        self.unresponsive: set[int] = set()  # workers killed for not answering pings, named if the run gives up
        self.cpu_counted = [0.0] * len(workers)  # each worker's cpu_seconds() already counted in a round

    def __len__(self) -> int:
        return len(self.workers)

    # -- answers ---------------------------------------------------------------------------------
    def get(self, refs: list[Ref]) -> list[Any]:
        answers: list[Any] = self.calls.get(refs, timeout=self.engine.round_timeout_s)
        return answers

    def get_from_each(self, refs: list[Ref]) -> list[Any]:
        """``get`` of one call per worker (``refs[i]`` on worker i), naming the silent workers on timeout.
        Not watched by pings: a worker still importing torch cannot answer them yet."""
        timeout = self.engine.round_timeout_s
        _, pending = self.calls.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            silent = [i for i, ref in enumerate(refs) if ref in pending]
            raise GetTimeoutError(f"{self.name(silent[0])} did not answer within engine.round_timeout_s="
                                  f"{timeout:g} (frozen, or out of memory)")
        answers: list[Any] = self.calls.get(refs)
        return answers

    def get_watching(self, refs: list[Ref]) -> list[Any]:
        """Like ``get`` for a round's calls, watched as ``as_completed`` watches them; in the order of ``refs``."""
        results: list[Any] = [None] * len(refs)
        for index, result in self.as_completed(refs):
            results[index] = result
        return results

    def as_completed(self, refs: list[Ref]) -> Iterator[tuple[int, Any]]:
        """(index in ``refs``, result) of each call as soon as it is done, so a caller can use and drop one
        answer before the next. A worker that stops answering pings is killed after engine.heartbeat_timeout_s,
        so its call fails now (and the round is redone on a replacement) instead of after the whole
        round_timeout_s. Pings run in their own thread on the worker, so a busy worker still answers; a frozen
        one (SIGSTOP, a lost machine) does not."""
        heartbeat, timeout = self.engine.heartbeat_timeout_s, self.engine.round_timeout_s
        deadline, next_ping = time.monotonic() + timeout, time.monotonic() + heartbeat
        index = {id(ref): i for i, ref in enumerate(refs)}  # ray.wait hands back the very refs it was given
        pending = list(refs)
        while pending:
            ready, pending = self.calls.wait(pending, num_returns=1, timeout=max(next_ping - time.monotonic(), 0))
            for ref in ready:
                yield index[id(ref)], self.calls.get(ref)
            if pending and time.monotonic() >= next_ping:
                self._kill_unresponsive()
                next_ping = time.monotonic() + heartbeat
                if time.monotonic() > deadline:
                    raise GetTimeoutError(f"no answer within engine.round_timeout_s={timeout:g}")

    def _kill_unresponsive(self) -> None:
        pings = {w.ping.remote(): index for index, w in enumerate(self.workers)}
        answered, _ = self.calls.wait(list(pings), num_returns=len(pings), timeout=self.engine.heartbeat_timeout_s)
        for ref, index in pings.items():
            if ref not in answered:
                self.unresponsive.add(index)
                self.calls.kill(self.workers[index])  # its pending call now fails with RayActorError: recovery follows

    def cpu_seconds_since_last(self) -> float:
        """The CPU time every worker in another process spent in calls since this was last asked (a replacement
        counts from 0): what a round cost on the workers, whatever else ran on their machines meanwhile. Workers
        in the caller's process (the local backend) count 0 here: the caller's own process time holds theirs, and
        adding them again doubled a local run's CPU seconds."""
        totals = self.get_from_each([w.cpu_seconds.remote() for w in self.workers])
        spent: float = sum(total - counted for total, counted in zip(totals, self.cpu_counted))
        self.cpu_counted = list(totals)
        return 0.0 if self.calls.in_this_process else spent

    # -- losses ----------------------------------------------------------------------------------
    def round_completed(self) -> None:
        self.losses_in_a_row = 0

    def replace_lost(self) -> None:
        """Replace every worker that does not answer a ping (dead, or frozen for PING_TIMEOUT_S); counted as one
        recovery. Raises WorkerLost once the losses in a row pass engine.max_recoveries."""
        lost = []
        for index, worker in enumerate(self.workers):
            try:
                self.calls.get(worker.ping.remote(), timeout=PING_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                self.calls.kill(worker)
                lost.append(index)
                self.workers[index] = self.spawn(self.assignments[index], self.bundles[index])
                self.cpu_counted[index] = 0.0
        self.recoveries += 1
        self.losses_in_a_row += 1
        if self.losses_in_a_row > self.engine.max_recoveries:
            raise WorkerLost(self._describe_loss(lost))

    def name(self, index: int) -> str:
        clients = sorted(self.assignments[index])
        shown = ", ".join(map(str, clients[:8])) + (f" and {len(clients) - 8} more" if len(clients) > 8 else "")
        return f"worker {index} (clients {shown})"

    def _describe_loss(self, lost: list[int]) -> str:
        index = lost[0] if lost else min(self.unresponsive, default=0)
        how = "stopped answering pings" if index in self.unresponsive else "died"
        return (f"{self.name(index)} {how} {self.losses_in_a_row} times in a row, more than "
                f"engine.max_recoveries={self.engine.max_recoveries}; check its memory (a smaller "
                "train.batch_size or fewer engine.workers per machine) or the client module")

    def shutdown(self) -> None:
        for w in self.workers:
            self.calls.kill(w)
