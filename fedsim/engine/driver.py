"""The driver: owns the global shared weights, samples clients, dispatches them to workers (each
client's owner where clients keep state), and averages what comes back. Runs as a Ray actor so a submitted job's
entrypoint only loops over rounds and writes results.

This module imports no torch: the driver's process is up in well under a second while the
workers (started by the entrypoint at the same time) spend ~3 s importing torch and Lightning."""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from fedsim import storage
from fedsim.algorithms import get_algorithm
from fedsim.config import RunConfig
from fedsim.engine import checkpoint
from fedsim.engine.aggregate import weighted_average
from fedsim.engine.protocol import ClientData, ClientUpdate, serialized_size, spawn_worker

if TYPE_CHECKING:
    from fedsim.data import Partition

PING_TIMEOUT_S = 60


def sample_clients(seed: int, round_idx: int, num_clients: int, fraction: float) -> list[int]:
    """max(1, round(f * N)) distinct clients, drawn from (seed, round) only."""
    count = max(1, round(fraction * num_clients))
    rng = np.random.default_rng([seed, round_idx, 0x5A3])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def balanced_owners(costs: Sequence[int], workers: int) -> list[int]:
    """Item -> worker, balanced by cost: longest first onto the least-loaded worker, ties to the lower
    index. Which worker runs a client never changes results (all randomness is per (seed, round,
    client)); it only sets how long each round waits for its slowest worker."""
    load, owners = [0] * workers, [0] * len(costs)
    for client in sorted(range(len(costs)), key=lambda c: (-costs[c], c)):
        worker = min(range(workers), key=lambda w: (load[w], w))
        owners[client] = worker
        load[worker] += costs[client]
    return owners


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """A client's SGD steps per local epoch: the cost that client -> worker balancing evens out."""
    return math.ceil(n_train / batch_size)


def assign_clients(cfg: RunConfig, partition: Partition) -> list[dict[int, ClientData]]:
    """Each worker's clients. Where clients keep state, ownership is fixed and balanced by SGD steps per
    epoch (the quickstart's k=4 partition: 49 vs 56 batches per worker under client % workers, 54 vs 51
    here). Where they keep none, every worker gets every client's data (index arrays only), so the driver
    can balance each round's sample instead."""
    workers = min(cfg.engine.workers, partition.num_clients)
    maps = partition.label_maps
    data = {c: ClientData(partition.train[c], partition.test[c], None if maps is None else maps[c])
            for c in range(partition.num_clients)}
    if not get_algorithm(cfg.algorithm).keeps_client_state:
        return [data] * workers
    owners = balanced_owners([steps_per_epoch(len(t), cfg.train.batch_size) for t in partition.train], workers)
    return [{c: d for c, d in data.items() if owners[c] == w} for w in range(workers)]


class Driver:
    """``workers[i]`` hosts ``assignments[i]``; the entrypoint spawns them so they start while this actor does."""

    def __init__(self, cfg: RunConfig, workers: list, assignments: list[dict[int, ClientData]],
                 initial_global: np.ndarray, slots: list):
        # A validated config object, not a dict: re-validating would import the model registry, hence torch.
        self.cfg = cfg
        self.fingerprint = checkpoint.fingerprint(cfg.model_dump())
        self.assignments = assignments  # kept to respawn a lost worker with the same clients, in the same slot
        self.slots = slots
        self.fixed_owners = get_algorithm(cfg.algorithm).keeps_client_state
        self.owner = {c: w for w, clients in enumerate(assignments) for c in clients} if self.fixed_owners else {}
        clients = {c: d for a in assignments for c, d in a.items()}
        self.num_clients = len(clients)
        self.train_steps = [steps_per_epoch(len(clients[c].train), cfg.train.batch_size) for c in range(self.num_clients)]
        self.test_sizes = [len(clients[c].test) for c in range(self.num_clients)]
        self.workers = list(workers)
        self.shared_size = initial_global.size
        self.initial_global = initial_global
        self.global_ref = ray.put(initial_global)
        # The global's size never changes. Measured on a copy: Ray hands this actor a read-only view,
        # which pickles 4 bytes differently from the arrays that travel later.
        self.bytes_down = serialized_size(initial_global.copy())
        self.last_checkpoint: str | None = None
        self.recoveries = 0

    def _get(self, refs):
        return ray.get(refs, timeout=self.cfg.engine.round_timeout_s)

    def worker_info(self) -> list[dict]:
        return self._get([w.device_info.remote() for w in self.workers])

    def _by_worker(self, clients: list[int], costs: list[int]) -> dict[int, list[int]]:
        """Worker -> its share of ``clients``: the owners where clients keep state, else a fresh
        cost-balanced split (which worker trains a client never changes its result)."""
        if self.fixed_owners:
            owners = [self.owner[c] for c in clients]
        else:
            owners = balanced_owners([costs[c] for c in clients], len(self.workers))
        groups: dict[int, list[int]] = {}
        for c, w in zip(clients, owners):
            groups.setdefault(w, []).append(c)
        return groups

    def _check_update(self, update: ClientUpdate) -> None:
        # Runtime guard: what reaches the server must be exactly the shared layout, never personal weights.
        if update.shared.shape != (self.shared_size,):
            raise RuntimeError(f"client {update.client} sent {update.shared.shape[0]} values; the shared part has "
                               f"{self.shared_size} - refusing a payload that could hold personal weights")

    # -- one round -------------------------------------------------------------------------------
    def round(self, round_idx: int) -> dict:
        """Train the sampled clients, aggregate, and (on evaluation rounds) score every client.
        A worker lost mid-round is replaced and the run rolls back to the last checkpoint."""
        try:
            return self._round(round_idx)
        except RayActorError:
            return {"round": round_idx, "rolled_back_to": self._recover()}

    def _round(self, round_idx: int) -> dict:
        start = time.perf_counter()
        sampled = sample_clients(self.cfg.seed, round_idx, self.num_clients, self.cfg.train.fraction)
        calls = [self.workers[w].train.remote(self.global_ref, cs, round_idx)
                 for w, cs in self._by_worker(sampled, self.train_steps).items()]
        # In client order, so logs and the client an error names do not depend on how work was split.
        updates: list[ClientUpdate] = sorted((u for batch in self._get(calls) for u in batch), key=lambda u: u.client)
        diverged = [u.client for u in updates if u.diverged]
        if diverged and self.cfg.train.on_nonfinite == "stop":
            return {"round": round_idx, "error": f"client {diverged[0]}, round {round_idx}: training loss is not finite; "
                    "lower train.body.lr / train.head.lr, or set train.on_nonfinite=drop to skip such updates"}
        kept = [u for u in updates if not u.diverged]
        for u in kept:
            self._check_update(u)
        if self.shared_size and kept:
            self.global_ref = ray.put(weighted_average([(u.client, u.n_train, u.shared) for u in kept]))
        train_loss = {u.client: u.train_loss for u in kept}
        records = []
        if round_idx % self.cfg.train.eval_every == 0 or round_idx == self.cfg.train.rounds:
            everyone = self._by_worker(list(range(self.num_clients)), self.test_sizes)
            calls = [self.workers[w].evaluate.remote(self.global_ref, cs, round_idx) for w, cs in everyone.items()]
            records = sorted((r for batch in self._get(calls) for r in batch), key=lambda r: r["client"])
            for r in records:
                r["round"] = round_idx
                r["train_loss"] = train_loss.get(r["client"])
        comm = [{"round": round_idx, "client": u.client, "bytes_down": self.bytes_down, "bytes_up": u.bytes_up} for u in kept]
        return {"round": round_idx, "sampled": sampled, "dropped": diverged, "records": records, "comm": comm,
                "seconds": time.perf_counter() - start}

    # -- checkpoints and recovery ----------------------------------------------------------------
    def checkpoint(self, run_location: str, round_idx: int) -> str:
        """Each worker writes its own file straight to the run's storage; then the driver publishes."""
        staging = checkpoint.begin(run_location, round_idx)
        names = [f"worker-{i}.npz" for i in range(len(self.workers))]
        self._get([w.save_state.remote(storage.join(staging, name)) for w, name in zip(self.workers, names)])
        meta = {"fingerprint": self.fingerprint, "recoveries": self.recoveries}
        self.last_checkpoint = checkpoint.finish(staging, round_idx, self._get(self.global_ref), meta, names)
        return self.last_checkpoint

    def restore(self, ckpt: str | None) -> int:
        """Load the global weights and every worker's clients from ``ckpt`` (None: round 0). Returns its round."""
        if ckpt is None:
            round_idx, global_vector = 0, self.initial_global
        else:
            with storage.local_folder(ckpt) as local:
                state, global_vector = checkpoint.read_state(local, self.fingerprint, self.shared_size)
            round_idx = int(state["round"])
        self._get([w.load_state.remote(ckpt) for w in self.workers])
        self.global_ref = ray.put(global_vector)
        self.last_checkpoint = ckpt
        return round_idx

    def _recover(self) -> int:
        """Replace dead workers and roll everyone back to the last checkpoint: every client's work since
        then is redone from the same inputs, so the results equal those of a fault-free run."""
        for index, worker in enumerate(self.workers):
            try:
                ray.get(worker.ping.remote(), timeout=PING_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                ray.kill(worker)
                self.workers[index] = spawn_worker(self.cfg, self.assignments[index], self.slots[index])
        self.recoveries += 1
        return self.restore(self.last_checkpoint)

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)


DriverActor = ray.remote(Driver)
