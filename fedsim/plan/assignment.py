"""Which worker trains which client: the run's worker count and the cost-balanced split. Which worker runs a client
never changes results (all randomness is per (seed, round, client)); it only sets how long each round waits for its
slowest worker.

This module imports no torch: the server's process balances each round's sample."""
from __future__ import annotations

import math
from collections.abc import Sequence

from fedsim.config import RunConfig


def balanced_owners(costs: Sequence[int], workers: int) -> list[int]:
    """Item -> worker, balanced by cost: longest first onto the least-loaded worker, ties to the lower
    index."""
    load, owners = [0] * workers, [0] * len(costs)
    for client in sorted(range(len(costs)), key=lambda c: (-costs[c], c)):
        worker = min(range(workers), key=lambda w: (load[w], w))
        owners[client] = worker
        load[worker] += costs[client]
    return owners


def worker_count(cfg: RunConfig) -> int:
    """The workers a run starts: engine.workers, but no more than there are clients (a worker without clients would
    only hold resources). What the run reserves, places and asks a local Ray to hold."""
    return min(cfg.engine.workers, cfg.data.num_clients)


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """A client's SGD steps per local epoch: the cost that client -> worker balancing evens out."""
    return math.ceil(n_train / batch_size)
