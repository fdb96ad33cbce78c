"""The driver: owns the global shared weights, samples clients, dispatches them to the workers
that own them, and averages what comes back. Runs as a Ray actor so a submitted job's
entrypoint only loops over rounds and writes results."""
from __future__ import annotations

import time

import numpy as np
import ray

from fedsim.config import RunConfig
from fedsim.data import Partition
from fedsim.engine.aggregate import weighted_average
from fedsim.engine.weights import Layout
from fedsim.engine.worker import ClientData, ClientRuntime, ClientUpdate, initial_model, shared_and_personal_keys

WorkerActor = ray.remote(ClientRuntime)


def sample_clients(seed: int, round_idx: int, num_clients: int, fraction: float) -> list[int]:
    """max(1, round(f * N)) distinct clients, drawn from (seed, round) only."""
    count = max(1, round(fraction * num_clients))
    rng = np.random.default_rng([seed, round_idx, 0x5A3])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def owner_of(client: int, workers: int) -> int:
    """Fixed client -> worker ownership: personal state lives on exactly one worker for the whole run."""
    return client % workers


class Driver:
    def __init__(self, cfg_dict: dict, partition: Partition, num_classes: int, input_shape: tuple[int, int, int]):
        self.cfg = RunConfig.model_validate(cfg_dict)
        self.num_clients = partition.num_clients
        engine = self.cfg.engine
        n_workers = min(engine.workers, self.num_clients)
        env = {"OMP_NUM_THREADS": str(engine.threads_per_worker), "MKL_NUM_THREADS": str(engine.threads_per_worker)}
        self.workers = [
            WorkerActor.options(num_cpus=engine.cpus_per_worker, num_gpus=engine.gpus_per_worker,
                                scheduling_strategy="SPREAD", runtime_env={"env_vars": env}).remote(
                cfg_dict, {c: self._client_data(partition, c) for c in range(self.num_clients)
                           if owner_of(c, n_workers) == w})
            for w in range(n_workers)
        ]
        net = initial_model(self.cfg, num_classes, input_shape)
        shared_keys, self.personal_keys = shared_and_personal_keys(self.cfg, net)
        self.layout = Layout.of(net, shared_keys)
        self.global_ref = ray.put(self.layout.pack(net))

    @staticmethod
    def _client_data(partition: Partition, client: int) -> ClientData:
        maps = partition.label_maps
        return ClientData(partition.train[client], partition.test[client], None if maps is None else maps[client])

    def worker_info(self) -> list[dict]:
        return ray.get([w.device_info.remote() for w in self.workers], timeout=self.cfg.engine.round_timeout_s)

    def _by_worker(self, clients: list[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for c in clients:
            groups.setdefault(owner_of(c, len(self.workers)), []).append(c)
        return groups

    def _check_update(self, update: ClientUpdate) -> None:
        # Runtime guard: what reaches the server must be exactly the shared layout, never personal weights.
        if update.shared.shape != (self.layout.size,):
            raise RuntimeError(f"client {update.client} sent {update.shared.shape[0]} values; the shared part has "
                               f"{self.layout.size} - refusing a payload that could hold personal weights")

    def round(self, round_idx: int) -> dict:
        """Train the sampled clients, aggregate, and (on evaluation rounds) score every client."""
        start = time.perf_counter()
        sampled = sample_clients(self.cfg.seed, round_idx, self.num_clients, self.cfg.train.fraction)
        calls = [self.workers[w].train.remote(self.global_ref, cs, round_idx) for w, cs in self._by_worker(sampled).items()]
        updates: list[ClientUpdate] = [u for batch in ray.get(calls, timeout=self.cfg.engine.round_timeout_s) for u in batch]
        for u in updates:
            self._check_update(u)
        if self.layout.size:
            new_global = weighted_average([(u.client, u.n_train, u.shared) for u in updates])
            self.global_ref = ray.put(new_global)  # one put per round; every worker reads the same object
        train_loss = {u.client: u.train_loss for u in updates}
        records = []
        if round_idx % self.cfg.train.eval_every == 0 or round_idx == self.cfg.train.rounds:
            everyone = self._by_worker(list(range(self.num_clients)))
            calls = [self.workers[w].evaluate.remote(self.global_ref, cs, round_idx) for w, cs in everyone.items()]
            batches = ray.get(calls, timeout=self.cfg.engine.round_timeout_s)
            records = sorted((r for batch in batches for r in batch), key=lambda r: r["client"])
            for r in records:
                r["round"] = round_idx
                r["train_loss"] = train_loss.get(r["client"])
        return {"round": round_idx, "sampled": sampled, "records": records,
                "seconds": time.perf_counter() - start, "bytes_up": sum(u.shared.nbytes for u in updates)}

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)


DriverActor = ray.remote(Driver)
