"""The Ray actor shells: a worker (hosting many virtual clients) and the server.

Kept free of torch: a process that receives an actor handle imports the module of the handle's
class, so the worker actor class is this thin shell, and the torch side (``ClientRuntime``, ~3 s of
imports) is built inside the worker's own process."""
from __future__ import annotations

import numpy as np
import ray

from fedsim.config import RunConfig
from fedsim.engine.protocol import ClientData, SumPlan, WorkerPartial
from fedsim.engine.server import Server


class Worker:
    """Ray actor hosting many virtual clients; every call goes to its ``ClientRuntime``."""

    def __init__(self, cfg_dict: dict, clients: dict[int, ClientData], init_weights: dict[str, np.ndarray] | None):
        from fedsim.client.runtime import ClientRuntime

        self.runtime = ClientRuntime(cfg_dict, clients, init_weights)

    def train_and_sum(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int,
                      plan: SumPlan) -> WorkerPartial:
        return self.runtime.train_and_sum(broadcast, clients, round_idx, plan)

    def evaluate(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> list[dict]:
        return self.runtime.evaluate(broadcast, clients, round_idx)

    def save_state(self, target: str, full: bool = True) -> None:
        self.runtime.save_state(target, full)

    def load_state(self, ckpt: str | None) -> None:
        self.runtime.load_state(ckpt)

    def device_info(self) -> dict:
        return self.runtime.device_info()

    @ray.method(concurrency_group="health")
    def ping(self) -> int:
        return self.runtime.ping()


# Pings run on a thread of their own, so a worker busy training still answers them (the server tells
# busy from frozen that way); every other call stays on the one default thread, in order.
WorkerActor = ray.remote(concurrency_groups={"health": 1})(Worker)
ServerActor = ray.remote(Server)


def spawn_worker(cfg: RunConfig, clients: dict[int, ClientData], init_weights=None, bundle="SPREAD"):
    """One worker actor at the configured CPU/GPU fractions, scheduled by ``bundle`` (its bundle of the run's
    placement group, see ``placement.bundles``). torch's thread count is set by the runtime itself: a per-actor
    runtime_env would cost a fresh process (~0.6 s) instead of a prestarted one."""
    engine = cfg.engine
    return WorkerActor.options(num_cpus=engine.cpus_per_worker, num_gpus=engine.gpus_per_worker,
                               scheduling_strategy=bundle).remote(cfg.model_dump(), clients, init_weights)
