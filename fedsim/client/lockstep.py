"""Hooks in lockstep: several client hooks, each on a thread of its own, run one at a time until each asks for
something (``LockstepThread.ask``); the coordinator then serves all the requests at once and lets them go on.
Packed training (engine.pack) runs a pack's client hooks so, and trains the clients that asked together."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class _Abandoned(BaseException):
    """Raised inside a hook whose pack-mate failed: its thread ends without doing more."""


class LockstepThread(threading.Thread):
    """One client hook on a thread of its own, running only while the coordinator waits for it."""

    def __init__(self, fn: Callable[[LockstepThread], Any]):
        super().__init__(daemon=True)
        self.fn = fn
        self.resume, self.parked = threading.Semaphore(0), threading.Semaphore(0)
        self.request: Any = None
        self.reply: Any = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = self.abandoned = False

    def run(self) -> None:
        self.resume.acquire()
        try:
            if self.abandoned:  # a pack-mate failed before this hook ever ran
                raise _Abandoned
            self.result = self.fn(self)
        except _Abandoned:
            pass
        except BaseException as err:  # handed to the coordinator, which raises it in the worker's own thread
            self.error = err
        finally:
            self.done = True
            self.parked.release()

    def ask(self, request: Any) -> Any:
        """From inside the hook: park with ``request`` until the coordinator has served it; its reply. A hook ended
        because a pack-mate failed asks nothing more (its cleanup code could otherwise park for ever)."""
        if self.abandoned:
            raise _Abandoned
        self.request = request
        self.parked.release()
        self.resume.acquire()
        if self.abandoned:
            raise _Abandoned
        return self.reply

    def step(self) -> None:
        """From the coordinator: let the hook run until it asks or finishes."""
        self.resume.release()
        self.parked.acquire()


def in_lockstep(hooks: list[Callable[[LockstepThread], Any]],
                serve: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """Run ``hooks`` one at a time, in order, each until it asks (``hook.ask(request)``) or returns; then
    ``serve`` all the requests at once and repeat. Deterministic: only one thread runs at any moment. A hook
    that raises ends the others and its error is raised here."""
    threads: list[LockstepThread] = []
    live = threads
    try:
        for fn in hooks:
            threads.append(LockstepThread(fn))
            threads[-1].start()
        while live:
            for t in live:
                t.step()
            error = next((t.error for t in live if t.error is not None), None)
            if error is not None:
                raise error
            live = [t for t in live if not t.done]
            if live:
                for t, reply in zip(live, serve([t.request for t in live])):
                    t.reply = reply
    finally:
        for t in threads:  # one at a time: an ended hook's cleanup runs alone too
            if not t.done:
                t.abandoned = True
                t.step()
            t.join()
    return [t.result for t in threads]
