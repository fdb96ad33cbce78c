"""A long-lived worker hosting many virtual clients in one model.

A client is only state: its data indices and (where the algorithm keeps parts local) a flat
vector of personal weights. Training a client = load global shared + its personal weights into
the one model, run local SGD through the LightningModule, pack the result back.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
from lightning_fabric import Fabric

from fedsim.algorithms import PARTS, get_algorithm
from fedsim.client import FedClient
from fedsim.config import RunConfig
from fedsim.data import ArrayDataset, load_dataset, random_crop_flip, to_float
from fedsim.engine.weights import Layout
from fedsim.models import build_model

EVAL_BATCH = 500


@dataclass(frozen=True)
class ClientUpdate:
    client: int
    n_train: int
    shared: np.ndarray  # flat shared weights after local training (empty when nothing is shared)
    train_loss: float


def client_generator(seed: int, round_idx: int, client: int) -> torch.Generator:
    """All of a client's randomness in a round (shuffling, augmentation) comes from (seed, round, client),
    never from the worker, so results do not depend on how clients are spread over workers."""
    state = np.random.SeedSequence([seed, round_idx, client]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def shared_and_personal_keys(cfg: RunConfig, net: torch.nn.Module) -> tuple[list[str], list[str]]:
    """Split state keys by what the algorithm shares; both workers and driver use this one rule."""
    body, head = net.split_keys(cfg.model.personal_layers)
    by_part = {"body": body, "head": head}
    shared_parts = get_algorithm(cfg.algorithm).shared_parts
    shared = [k for part in ("body", "head") if part in shared_parts for k in by_part[part]]
    shared_set = set(shared)
    return shared, [k for k in net.state_dict() if k not in shared_set]


def initial_model(cfg: RunConfig, num_classes: int, input_shape: tuple[int, int, int]) -> torch.nn.Module:
    """The round-0 model, identical in every process because it is built from the run's seed."""
    torch.manual_seed(cfg.seed)
    return build_model(cfg.model.name, num_classes, input_shape)


class ClientRuntime:
    """Plain-Python core of a worker (the Ray actor wraps it; tests may use it directly)."""

    def __init__(self, cfg_dict: dict, client_data: dict[int, tuple[np.ndarray, np.ndarray]]):
        self.cfg = RunConfig.model_validate(cfg_dict)
        torch.set_num_threads(self.cfg.engine.threads_per_worker)
        for name in ("pytorch_lightning", "lightning_fabric", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self.data: ArrayDataset = load_dataset(self.cfg.data.dataset, self.cfg.data.root, self.cfg.data.download)
        self.client_data = client_data
        self.algorithm = get_algorithm(self.cfg.algorithm)

        net = initial_model(self.cfg, self.data.num_classes, self.data.input_shape)
        _, head_keys = net.split_keys(self.cfg.model.personal_layers)
        shared_keys, personal_keys = shared_and_personal_keys(self.cfg, net)
        self.shared_layout = Layout.of(net, shared_keys)
        self.personal_layout = Layout.of(net, personal_keys)
        self.initial_personal = self.personal_layout.pack(net)
        self.personal: dict[int, np.ndarray] = {}

        module = FedClient(net, head_keys, self.data.num_classes, self.cfg.train.body, self.cfg.train.head)
        # Fabric rather than a Trainer: a Trainer costs ~7 ms per fit and must be coaxed into refitting;
        # Fabric adds ~0.1-2 ms per client and still runs the module's own training_step (NOTES-stack.md).
        self.fabric = Fabric(accelerator="cuda" if self._assigned_gpu() else "cpu", devices=1)
        self.raw_optimizers = module.configure_optimizers()
        self.client_module = module  # attributes (trainable, accuracy) live on the plain module
        self.module, *_ = self.fabric.setup(module, *self.raw_optimizers)  # calls go through Fabric's wrapper
        self.net = module.net

    @staticmethod
    def _assigned_gpu() -> bool:
        try:
            import ray

            return bool(ray.is_initialized() and ray.get_gpu_ids()) and torch.cuda.is_available()
        except Exception:  # outside a Ray actor: CPU
            return False

    def device_info(self) -> dict:
        import ray

        return {"device": str(self.fabric.device), "gpu_ids": ray.get_gpu_ids() if ray.is_initialized() else [],
                "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def _load(self, shared: np.ndarray, client: int) -> None:
        self.shared_layout.unpack_into(self.net, shared)
        self.personal_layout.unpack_into(self.net, self.personal.get(client, self.initial_personal))

    def _tensors(self, images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = to_float(images, self.data.mean, self.data.std).to(self.fabric.device)
        return x, torch.as_tensor(labels, device=self.fabric.device)

    def train(self, shared: np.ndarray, clients: list[int], round_idx: int) -> list[ClientUpdate]:
        return [self._train_one(shared, c, round_idx) for c in clients]

    def _train_one(self, shared: np.ndarray, client: int, round_idx: int) -> ClientUpdate:
        self._load(shared, client)
        for opt in self.raw_optimizers:  # momentum restarts every round, as in FedAvg/FedPer's ClientUpdate
            opt.state.clear()
        train_idx = self.client_data[client][0]
        x, y = self._tensors(self.data.train_x[train_idx], self.data.train_y[train_idx])
        gen = client_generator(self.cfg.seed, round_idx, client)
        self.module.train()
        self.client_module.trainable = set(PARTS[self.algorithm.train])
        losses = []
        batch = self.cfg.train.batch_size
        for _ in range(self.cfg.train.local_epochs):
            order = torch.randperm(len(y), generator=gen).to(self.fabric.device)
            for step, start in enumerate(range(0, len(y), batch)):
                idx = order[start:start + batch]
                xb = x[idx]
                if self.cfg.data.augment:
                    xb = random_crop_flip(xb, gen)
                losses.append(self.module.training_step((xb, y[idx]), step))
        loss = float(torch.stack(losses).mean())
        if not np.isfinite(loss):
            raise FloatingPointError(f"client {client}, round {round_idx}: training loss is {loss}; lower train.*.lr")
        self.personal[client] = self.personal_layout.pack(self.net)
        return ClientUpdate(client, len(y), self.shared_layout.pack(self.net), loss)

    @torch.no_grad()
    def evaluate(self, shared: np.ndarray, clients: list[int]) -> list[dict]:
        """Each client's model (global shared + its personal part) on its own test split."""
        self.module.eval()
        results = []
        for client in clients:
            self._load(shared, client)
            train_idx, test_idx = self.client_data[client]
            x, y = self._tensors(self.data.test_x[test_idx], self.data.test_y[test_idx])
            self.client_module.accuracy.reset()
            loss_sum = sum(self.client_module.evaluate_batch((x[i:i + EVAL_BATCH], y[i:i + EVAL_BATCH]))
                           for i in range(0, len(y), EVAL_BATCH))
            results.append({"client": client, "n_train": len(train_idx), "n_test": len(test_idx),
                            "loss": loss_sum / len(y), "acc": float(self.client_module.accuracy.compute())})
        return results
