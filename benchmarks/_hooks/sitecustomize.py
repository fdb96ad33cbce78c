"""Measurement hooks for benchmarks/population.py, loaded by every Python process of a run (this folder is put
on PYTHONPATH, so Ray's actors import it at start-up) when FEDSIM_BENCH_EVENTS names a file. The same hooks time
today's engine and the old one (commit dae5d9e) without changing either: after the module that aggregates is
imported, its aggregation is wrapped with a clock, and the server's ``ray.get`` counts the array bytes it
receives. Each event is one JSON line appended to that file: {"pid", "event", "seconds" | "bytes"}.

  server (today): RoundSums.add (fold one partial as it arrives), SumReduction.update (means and server hook,
                  tensor by tensor), or ReplyReduction.fold (a robust rule over every reply: server.aggregator),
                  Server._publish, Server._evaluate; the array bytes of each answer received (before issue 64:
                  Server._aggregate and Server._fold_replies)
  server (commit add413d and before): Server._aggregate (add W partials, server hook, publish); the array bytes
                  of each ray.get
  workers (today): resident.ExactSum.stage + add (the per-client exact sums, on the worker)
  driver (old engine): driver.weighted_average (the fold of K vectors) and the ray.put that publishes it
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

EVENTS = os.environ.get("FEDSIM_BENCH_EVENTS")


def emit(event: str, **values) -> None:
    with open(EVENTS, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "event": event, **values}) + "\n")


def timed(event: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            emit(event, seconds=time.perf_counter() - start)
    return wrapper


def array_bytes(obj) -> int:
    """Bytes of the numpy arrays inside what a ray.get returned (lists, dicts, dataclasses)."""
    if hasattr(obj, "nbytes") and hasattr(obj, "dtype"):
        return int(obj.nbytes)
    if isinstance(obj, (list, tuple)):
        return sum(map(array_bytes, obj))
    if isinstance(obj, dict):
        return sum(map(array_bytes, obj.values()))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(array_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0


def counted_answers(fn):
    """A generator of (index, answer) that emits each answer's array bytes as it is handed over."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for index, answer in fn(*args, **kwargs):
            emit("received", bytes=array_bytes(answer))
            yield index, answer
    return wrapper


def count_received(ray) -> None:
    get = ray.get

    @functools.wraps(get)
    def counted(refs, *args, **kwargs):
        out = get(refs, *args, **kwargs)
        emit("received", bytes=array_bytes(out))
        return out
    ray.get = counted


def patch(name: str, module) -> None:
    if name == "fedsim.engine.server":
        reduction = sys.modules.get("fedsim.engine.reduction")  # the round's reduction in its own classes (issue 64)
        if reduction is not None:
            reduction.SumReduction.update = timed("aggregate", reduction.SumReduction.update)
            reduction.ReplyReduction.fold = timed("aggregate", reduction.ReplyReduction.fold)
        else:
            module.Server._aggregate = timed("aggregate", module.Server._aggregate)
            if hasattr(module.Server, "_fold_replies"):  # a server that sees replies (server.aggregator, issue 26)
                module.Server._fold_replies = timed("aggregate", module.Server._fold_replies)
        module.Server._evaluate = timed("evaluate", module.Server._evaluate)
        pool = sys.modules.get("fedsim.engine.pool")  # the worker pool in its own class (issue 44)
        if pool is not None:
            sums = reduction.RoundSums if reduction is not None else module.RoundSums
            sums.add = timed("fold", sums.add)
            module.Server._publish = timed("publish", module.Server._publish)
            pool.WorkerPool.as_completed = counted_answers(pool.WorkerPool.as_completed)
        elif hasattr(module.Server, "_as_completed"):  # answers folded one by one as they arrive
            module.RoundSums.add = timed("fold", module.RoundSums.add)
            module.Server._publish = timed("publish", module.Server._publish)
            module.Server._as_completed = counted_answers(module.Server._as_completed)
        else:
            count_received(module.ray)
        # ray.remote copies an actor class's (non-generator) methods when it decorates it, at import: without
        # decorating the patched class again, the server actor would run the unpatched methods.
        module.ServerActor = module.ray.remote(module.Server)
    elif name == "fedsim.engine.driver" and hasattr(module, "weighted_average"):  # the old engine (commit dae5d9e)
        module.weighted_average = timed("aggregate", module.weighted_average)
        module.ray.put = timed("publish", module.ray.put)
        count_received(module.ray)
    elif name == "fedsim.client.resident":
        module.ExactSum.stage = timed("worker_sum", module.ExactSum.stage)
        module.ExactSum.add = timed("worker_sum", module.ExactSum.add)


class Finder(importlib.abc.MetaPathFinder):
    """Patches the modules above right after they are executed."""
    NAMES = {"fedsim.engine.server", "fedsim.engine.driver", "fedsim.client.resident"}

    def find_spec(self, name, path, target=None):
        if name not in self.NAMES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        execute = spec.loader.exec_module

        def exec_and_patch(module):
            execute(module)
            patch(name, module)
        spec.loader.exec_module = exec_and_patch
        return spec


if EVENTS:
    sys.meta_path.insert(0, Finder())
