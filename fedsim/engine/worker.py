"""A long-lived worker hosting many virtual clients in one model.

A client is only state: its data indices (and label map) plus, where the algorithm keeps parts
local, a flat vector of personal weights. Training a client = load the global shared weights and
its personal weights into the one model, run local SGD through the LightningModule, pack back.
"""
from __future__ import annotations

import importlib
import logging
import os

import numpy as np
import ray
import torch
from lightning_fabric import Fabric
from torch import nn

from fedsim import storage
from fedsim.algorithms import PARTS, get_algorithm
from fedsim.client import FedClient
from fedsim.config import ConfigError, RunConfig
from fedsim.data import ArrayDataset, load_dataset, random_crop_flip, to_float
from fedsim.engine.checkpoint import CheckpointError, read_worker_states, write_worker_state
from fedsim.engine.protocol import ClientData, ClientUpdate, serialized_size
from fedsim.engine.weights import Layout, VectorStore
from fedsim.models import SplitNet, build_model

EVAL_BATCH = 500
FINETUNE_STREAM = 1  # keeps evaluation fine-tuning randomness apart from training's


def client_generator(seed: int, round_idx: int, client: int, stream: int = 0) -> torch.Generator:
    """All of a client's randomness in a round (shuffling, augmentation) comes from (seed, round, client),
    never from the worker, so results do not depend on how clients are spread over workers."""
    state = np.random.SeedSequence([seed, round_idx, client, stream]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def shared_and_personal_keys(cfg: RunConfig, net: SplitNet) -> tuple[list[str], list[str]]:
    """Split state keys by what the algorithm shares; workers and driver use this one rule."""
    body, head = net.split_keys(cfg.model.personal_layers)
    by_part = {"body": body, "head": head}
    shared_parts = get_algorithm(cfg.algorithm).shared_parts
    shared = {k for part in ("body", "head") if part in shared_parts for k in by_part[part]}
    keys = list(net.state_dict())
    return [k for k in keys if k in shared], [k for k in keys if k not in shared]


def load_client_class(path: str | None) -> type[FedClient]:
    """``model.client``: a user's LightningModule meeting FedClient's contract; FedClient by default."""
    if path is None:
        return FedClient
    module_name, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"model.client: cannot import {path!r} ({err}); give 'package.module:Class'") from None


def initial_model(cfg: RunConfig, num_classes: int, input_shape: tuple[int, int, int]) -> SplitNet:
    """The round-0 model, identical in every process because it is built from the run's seed."""
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model.name, num_classes, input_shape)
    if get_algorithm(cfg.algorithm).orthogonal_head:
        with torch.no_grad():  # FedBABU: orthonormal classifier rows give every class an equally separated target
            nn.init.orthogonal_(net.output_layer.weight)
            if net.output_layer.bias is not None:
                net.output_layer.bias.zero_()
    return net


def shared_layout(cfg: RunConfig, num_classes: int, input_shape: tuple[int, int, int]) -> tuple[Layout, np.ndarray]:
    """Layout and round-0 value of the weights the server holds."""
    net = initial_model(cfg, num_classes, input_shape)
    layout = Layout.of(net, shared_and_personal_keys(cfg, net)[0])
    return layout, layout.pack(net)


class ClientRuntime:
    """Plain-Python core of a worker (the Ray actor wraps it; tests may use it directly)."""

    def __init__(self, cfg_dict: dict, client_data: dict[int, ClientData]):
        self.cfg = RunConfig.model_validate(cfg_dict)
        torch.set_num_threads(self.cfg.engine.threads_per_worker)
        for name in ("pytorch_lightning", "lightning_fabric", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.WARNING)
        d = self.cfg.data
        self.data: ArrayDataset = load_dataset(d.dataset, d.root, d.download, options=d.options)
        self.augment = d.augment and self.data.augmentable
        self.client_data = client_data
        self.algorithm = get_algorithm(self.cfg.algorithm)

        net = initial_model(self.cfg, self.data.num_classes, self.data.input_shape)
        _, head_keys = net.split_keys(self.cfg.model.personal_layers)
        shared_keys, personal_keys = shared_and_personal_keys(self.cfg, net)
        self.shared_layout = Layout.of(net, shared_keys)
        self.personal_layout = Layout.of(net, personal_keys)
        self.full_layout = Layout.of(net, list(net.state_dict()))
        self.initial_personal = self.personal_layout.pack(net)
        self.initial_full = self.full_layout.pack(net)
        self.personal = VectorStore(self.personal_layout.size)  # client -> personal part of the model
        self.personal_models = VectorStore(self.full_layout.size)  # client -> full personal model (Ditto)

        on_gpu = self._assigned_gpu()
        fmt = self.cfg.engine.memory_format
        self.channels_last = fmt == "channels_last" or (fmt == "auto" and not on_gpu)
        if self.channels_last:  # packing reads logical order (reshape), so flat vectors do not change
            net.to(memory_format=torch.channels_last)
        client_cls = load_client_class(self.cfg.model.client)
        module = client_cls(net, head_keys, self.data.num_classes, self.cfg.train.body, self.cfg.train.head)
        # Fabric rather than a Trainer: a Trainer costs ~7 ms per fit and must be coaxed into refitting;
        # Fabric adds ~0.1-2 ms per client and still runs the module's own training_step (NOTES-stack.md).
        self.fabric = Fabric(accelerator="cuda" if on_gpu else "cpu", devices=1)
        self.raw_optimizers = module.configure_optimizers()
        self.client_module = module  # attributes (trainable, proximal, accuracy) live on the plain module
        self.module, *_ = self.fabric.setup(module, *self.raw_optimizers)  # calls go through Fabric's wrapper
        self.net = module.net

    @staticmethod
    def _assigned_gpu() -> bool:
        return bool(ray.is_initialized() and ray.get_gpu_ids()) and torch.cuda.is_available()

    def device_info(self) -> dict:
        return {"device": str(self.fabric.device), "gpu_ids": ray.get_gpu_ids() if ray.is_initialized() else [],
                "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    # -- state ---------------------------------------------------------------------------------
    def _load(self, shared: np.ndarray, client: int) -> None:
        self.shared_layout.unpack_into(self.net, shared)
        self.personal_layout.unpack_into(self.net, self.personal.get(client, self.initial_personal))

    def _load_for_eval(self, shared: np.ndarray, client: int) -> None:
        if self.algorithm.personal_model:
            self.full_layout.unpack_into(self.net, self.personal_models.get(client, self.initial_full))
        else:
            self._load(shared, client)

    def _tensors(self, client: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        cd = self.client_data[client]
        idx = cd.train if split == "train" else cd.test
        images = self.data.train_x[idx] if split == "train" else self.data.test_x[idx]
        labels = self.data.train_y[idx] if split == "train" else self.data.test_y[idx]
        if cd.label_map is not None:
            labels = cd.label_map[labels]
        x = to_float(images, self.data.mean, self.data.std).to(self.fabric.device)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, torch.as_tensor(labels, device=self.fabric.device)

    # -- local SGD -----------------------------------------------------------------------------
    def _anchor(self, keys: tuple[str, ...], coef: float) -> None:
        """Pull the named parameters toward their current (just received) values with strength coef."""
        params = dict(self.net.named_parameters())
        pairs = [(params[k], params[k].detach().clone()) for k in keys if k in params]
        self.client_module.proximal = (coef, pairs) if coef > 0 and pairs else None

    def _sgd(self, x: torch.Tensor, y: torch.Tensor, parts: frozenset[str], epochs: int,
             gen: torch.Generator) -> list[torch.Tensor]:
        for opt in self.raw_optimizers:  # momentum restarts with every phase, as in FedAvg's ClientUpdate
            opt.state.clear()
        self.module.train()
        self.client_module.trainable = set(parts)
        losses, batch = [], self.cfg.train.batch_size
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=gen).to(self.fabric.device)
            for step, start in enumerate(range(0, len(y), batch)):
                idx = order[start:start + batch]
                xb = random_crop_flip(x[idx], gen) if self.augment else x[idx]
                losses.append(self.module.training_step((xb, y[idx]), step))
        return losses

    def train(self, shared: np.ndarray, clients: list[int], round_idx: int) -> list[ClientUpdate]:
        return [self._train_one(shared, c, round_idx) for c in clients]

    def _train_one(self, shared: np.ndarray, client: int, round_idx: int) -> ClientUpdate:
        algo, tcfg = self.algorithm, self.cfg.train
        x, y = self._tensors(client, "train")
        gen = client_generator(self.cfg.seed, round_idx, client)
        self._load(shared, client)
        self._anchor(self.shared_layout.keys, tcfg.mu if algo.proximal else 0.0)
        losses = []
        if algo.head_first:
            losses += self._sgd(x, y, PARTS["head"], tcfg.head_epochs, gen)
        losses += self._sgd(x, y, algo.trained_parts, tcfg.local_epochs, gen)
        self.client_module.proximal = None
        loss = float(torch.stack(losses).mean())
        if not np.isfinite(loss):  # keep nothing of this client's round; the driver decides stop or drop
            return ClientUpdate(client, len(y), np.empty(0, np.float32), loss, 0, diverged=True)
        if self.personal_layout.size:  # FedAvg-like: nothing personal to keep (or to checkpoint)
            self.personal[client] = self.personal_layout.pack(self.net)
        vector = self.shared_layout.pack(self.net)
        if algo.personal_model:
            self._train_personal_model(shared, client, x, y, gen)
        return ClientUpdate(client, len(y), vector, loss, serialized_size(vector))

    def _train_personal_model(self, shared: np.ndarray, client: int, x: torch.Tensor, y: torch.Tensor,
                              gen: torch.Generator) -> None:
        """Ditto: the client's own full model, trained with a pull toward the received global model."""
        self.shared_layout.unpack_into(self.net, shared)
        self._anchor(self.full_layout.keys, self.cfg.train.ditto_lambda)
        self.full_layout.unpack_into(self.net, self.personal_models.get(client, self.initial_full))
        self._sgd(x, y, PARTS["full"], self.cfg.train.local_epochs, gen)
        self.client_module.proximal = None
        self.personal_models[client] = self.full_layout.pack(self.net)

    # -- persistence (checkpoints are written by the owner; personal weights never reach the driver) --
    def ping(self) -> int:
        return os.getpid()

    def save_state(self, target: str) -> None:
        """Write this worker's clients to ``target``: a local path, or a URI in the run's object store."""
        with storage.local_output(target) as path:
            write_worker_state(path, self.personal, self.personal_models)

    def load_state(self, ckpt: str | None) -> None:
        """Restore this worker's clients from a checkpoint (None: the round-0 state)."""
        with storage.local_folder(ckpt) as local:
            personal, models = read_worker_states(local, set(self.client_data)) if local else ({}, {})
        if any(v.size != self.personal_layout.size for v in personal.values()) or any(
                v.size != self.full_layout.size for v in models.values()):
            raise CheckpointError(f"{ckpt}: personal weights do not fit this model; resume with the run's own config")
        self.personal = VectorStore(self.personal_layout.size)
        self.personal_models = VectorStore(self.full_layout.size)
        for store, vectors in ((self.personal, personal), (self.personal_models, models)):
            for client in sorted(vectors):
                store[client] = vectors[client]

    # -- evaluation ----------------------------------------------------------------------------
    @torch.no_grad()
    def _score(self, client: int) -> tuple[float, float]:
        self.module.eval()
        x, y = self._tensors(client, "test")
        self.client_module.accuracy.reset()
        loss_sum = sum(self.client_module.evaluate_batch((x[i:i + EVAL_BATCH], y[i:i + EVAL_BATCH]))
                       for i in range(0, len(y), EVAL_BATCH))
        return loss_sum / len(y), float(self.client_module.accuracy.compute())

    def evaluate(self, shared: np.ndarray, clients: list[int], round_idx: int) -> list[dict]:
        """FedBABU's protocol for every algorithm: *initial* accuracy of the model the client holds,
        and *personalized* accuracy after eval.finetune_epochs on its own training data. Fine-tuning
        works on the loaded copy and is never packed back, so training continues from untouched state."""
        ecfg, results = self.cfg.eval, []
        for client in clients:
            cd = self.client_data[client]
            self._load_for_eval(shared, client)
            loss, acc = self._score(client)
            rec = {"client": client, "n_train": len(cd.train), "n_test": len(cd.test), "loss": loss, "acc": acc}
            if ecfg.finetune_epochs:
                x, y = self._tensors(client, "train")
                gen = client_generator(self.cfg.seed, round_idx, client, FINETUNE_STREAM)
                self._sgd(x, y, PARTS[ecfg.finetune_part], ecfg.finetune_epochs, gen)
                rec["loss_personalized"], rec["acc_personalized"] = self._score(client)
            results.append(rec)
        return results

