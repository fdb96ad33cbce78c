"""What the driver and the workers send each other, and the worker actor's remote interface.

Kept free of torch: the driver process only routes and averages, and a process that receives an
actor handle imports the module of the handle's class. So the actor class is this thin shell, and
the torch side (``ClientRuntime``, ~3 s of imports) is built inside the worker's own process."""
from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
import ray

from fedsim.config import RunConfig


@dataclass(frozen=True)
class ClientData:
    train: np.ndarray  # indices into the dataset's train arrays
    test: np.ndarray
    label_map: np.ndarray | None = None  # client label = label_map[true label] (conflicting-label partitions)


@dataclass(frozen=True)
class ClientUpdate:
    client: int
    n_train: int
    shared: np.ndarray  # flat shared weights after local training (empty when nothing is shared)
    train_loss: float
    bytes_up: int  # serialised size of ``shared``: what this client sends to the server
    diverged: bool = False  # non-finite loss: nothing was kept, ``shared`` is empty


def serialized_size(array: np.ndarray) -> int:
    return len(pickle.dumps(array, protocol=5))


class Worker:
    """Ray actor hosting many virtual clients; every call goes to its ``ClientRuntime``."""

    def __init__(self, cfg_dict: dict, clients: dict[int, ClientData]):
        from fedsim.engine.worker import ClientRuntime

        self.runtime = ClientRuntime(cfg_dict, clients)

    def train(self, shared: np.ndarray, clients: list[int], round_idx: int) -> list[ClientUpdate]:
        return self.runtime.train(shared, clients, round_idx)

    def evaluate(self, shared: np.ndarray, clients: list[int], round_idx: int) -> list[dict]:
        return self.runtime.evaluate(shared, clients, round_idx)

    def save_state(self, path: str) -> None:
        self.runtime.save_state(path)

    def load_state(self, ckpt: str | None) -> None:
        self.runtime.load_state(ckpt)

    def device_info(self) -> dict:
        return self.runtime.device_info()

    def ping(self) -> int:
        return self.runtime.ping()


WorkerActor = ray.remote(Worker)


def spawn_worker(cfg: RunConfig, clients: dict[int, ClientData], slot="SPREAD"):
    """One worker actor at the configured CPU/GPU fractions, in ``slot`` (its bundle of the run's placement
    group, see ``placement.slots``). torch's thread count is set by the runtime itself: a per-actor
    runtime_env would cost a fresh process (~0.6 s) instead of a prestarted one."""
    engine = cfg.engine
    return WorkerActor.options(num_cpus=engine.cpus_per_worker, num_gpus=engine.gpus_per_worker,
                               scheduling_strategy=slot).remote(cfg.model_dump(), clients)
