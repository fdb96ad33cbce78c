"""The torch side of a worker: many virtual clients in one model.

A client is only state: its data indices (and label map) plus the named per-client slots its
algorithm keeps (always ``personal``: the part of the model that is not shared). Training a client =
the algorithm's client hook run on a :class:`~fedsim.algorithms.context.ClientContext` over the one model;
this runtime is the context's :class:`~fedsim.algorithms.context.RuntimePort`.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pytorch_lightning as pl
import ray
import torch

from fedsim import storage
from fedsim.algorithms import PARTS
from fedsim.algorithms.context import ClientContext, Penalty, StepCallback
from fedsim.client.device import make_cuda_deterministic
from fedsim.client.loop import FedsimFabric, LocalLoop, OptimizerSet
from fedsim.client.packed import Hyper, PackedClient, PackedTrainer, TrainRequest, in_lockstep
from fedsim.client.packsize import choose_pack_size
from fedsim.client.resident import BoundLayout, ExactSum, host_vector, to_device
from fedsim.config import CallbackSpec, OptimConfig
from fedsim.core.checkpoint import CheckpointError, local_checkpoint, worker_vectors, write_worker_state
from fedsim.core.protocol import (ClientData, ClientReport, FixedPointScales, Reply, WorkerPartial, WorkerReplies,
                                  payload_bytes)
from fedsim.core.store import StateMemory, VectorStore
from fedsim.data import ArrayDataset, load_dataset, shuffled_batches, to_float
from fedsim.errors import UserCodeError
from fedsim.models.lightning import (config_optimizers, module_optimizers, network_of, optimizer_parts,
                                     overrides, part_parameters)
from fedsim.models.state import output_layer
from fedsim.plan import RunPlan
from fedsim.plan.build import initial_client
from fedsim.plugins import load_plugin

EVAL_BATCH = 500
FINETUNE_STREAM = 1  # keeps evaluation fine-tuning randomness apart from training's


def client_generator(seed: int, round_idx: int, client: int, stream: int = 0) -> torch.Generator:
    """All of a client's randomness in a round (shuffling, augmentation) comes from (seed, round, client),
    never from the worker, so results do not depend on how clients are spread over workers."""
    state = np.random.SeedSequence([seed, round_idx, client, stream]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


@dataclass(frozen=True)
class Trained:
    """One client's round on this worker, before the runtime keeps or sums it."""
    n_train: int
    loss: torch.Tensor  # a scalar on the worker's device, read by the caller together with its other answers
    uploads: dict[str, torch.Tensor]  # on the worker's device
    slots: dict[str, np.ndarray]  # staged per-client state
    logged: dict[str, float]  # what the module's self.log recorded in this round's training


class ClientRuntime:
    """Plain-Python core of a worker (the Ray actor in ``fedsim.client.worker`` wraps it)."""

    def __init__(self, plan: RunPlan, client_data: dict[int, ClientData]):
        self.plan = plan
        self.cfg = cfg = plan.cfg
        self.algorithm = plan.algorithm
        torch.set_num_threads(cfg.engine.threads_per_worker)
        for name in ("pytorch_lightning", "lightning_fabric", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.WARNING)
        d = cfg.data
        self.data: ArrayDataset = load_dataset(d.dataset, d.root, d.download, options=d.options)
        self.augment = d.augment and self.data.augmentable
        self.client_data = client_data
        self.local_epochs = cfg.train.local_epochs

        # The client module from the seed, as the driver built it; its values are the plan's round-0 model.
        module, keys = initial_client(cfg, self.algorithm, plan.num_classes, plan.input_shape)
        self.net = network_of(module)
        on_gpu = self._assigned_gpu()
        if on_gpu:
            make_cuda_deterministic()
        fmt = cfg.engine.memory_format
        self.channels_last = fmt == "channels_last" or (fmt == "auto" and not on_gpu)
        if self.channels_last:  # packing reads logical order (reshape), so flat vectors do not change
            self.net.to(memory_format=torch.channels_last)
        # Fabric rather than a Trainer: a Trainer costs ~7 ms per fit and must be coaxed into refitting; Fabric adds
        # ~0.1-2 ms per client and still runs the module's own training_step (docs/stack-notes.md).
        self.fabric = FedsimFabric(accelerator="cuda" if on_gpu else "cpu", devices=1, precision=cfg.model.precision)
        params = part_parameters(module, keys)
        made = module_optimizers(module, params, {"body": cfg.train.body, "head": cfg.train.head})
        _, *wrapped = self.fabric.setup(module, *made.optimizers)  # the module learns its Fabric and optimizers
        train = OptimizerSet(made.optimizers, made.schedulers, wrapped, optimizer_parts(made.optimizers, module, keys))
        self.own_optimizers = plan.model.own_optimizers  # the driver's reading of the module; else train.body / head
        own, listed = self._callbacks(module)
        self.loop = LocalLoop(module, self.fabric, {"train": train, "finetune": self._finetune_set(module, keys, train)},
                              keys, [*own, *listed], plan.num_classes, listed, cfg.model.precision,
                              cfg.model.client_loop == "trainer")
        self.device = self.fabric.device
        self.layouts = {name: BoundLayout.bind(layout, self.net, self.device)
                        for name, layout in plan.model.layouts.items()}
        self.layouts["full"].load(plan.model.initial["full"])
        self.parameter_keys = frozenset(key for key, _ in self.net.named_parameters())
        self.part_of = {**dict.fromkeys(keys.body, "body"), **dict.fromkeys(keys.head, "head")}
        self.pack_size, _ = plan.packing
        # Packed kernels on a CPU run in channels_last whatever engine.memory_format says: in the contiguous layout a
        # client's result was measured to depend on its place in the pack (docs/packed.md).
        self.trainer = None if self.pack_size == 1 else PackedTrainer(
            self.net, self.layouts["full"].keys, self.parameter_keys, self.channels_last or self.device.type == "cpu")
        self.slots = self._empty_slots()
        self._held: tuple[np.ndarray, int] | None = None  # (broadcast weights in the model, their tensors' version)
        self._resident: tuple[np.ndarray, torch.Tensor] | None = None  # (broadcast weights, their copy on the device)
        self._auto_pack: int | None = None

    def _finetune_set(self, module: pl.LightningModule, keys, train: OptimizerSet) -> OptimizerSet:
        """Evaluation fine-tuning's optimizers: a module's own (each update starts them afresh anyway), or for
        fedsim's own, FedBABU's protocol: SGD per part with eval.finetune_momentum / finetune_weight_decay."""
        if self.own_optimizers:
            return train
        e = self.cfg.eval
        sgd = OptimConfig(optimizer="sgd", momentum=e.finetune_momentum, weight_decay=e.finetune_weight_decay)
        optimizers = config_optimizers(part_parameters(module, keys), {"body": sgd, "head": sgd})
        wrapped = self.fabric.setup_optimizers(*optimizers)
        return OptimizerSet(optimizers, [], list(wrapped) if isinstance(wrapped, tuple) else [wrapped],
                            optimizer_parts(optimizers, module, keys))

    def _callbacks(self, module: pl.LightningModule) -> tuple[list[pl.Callback], list[pl.Callback]]:
        """The module's configure_callbacks and model.callbacks, as Lightning would use them in every fit."""
        own = module.configure_callbacks() if overrides(module, "configure_callbacks") else []
        own = list(own) if isinstance(own, (list, tuple)) else [own]
        listed = []
        for spec in self.cfg.model.callbacks:
            spec = spec if isinstance(spec, CallbackSpec) else CallbackSpec(class_path=spec)
            try:
                listed.append(load_plugin(spec.class_path, "model.callbacks")(**spec.init_args))
            except (ValueError, TypeError) as err:
                raise UserCodeError(f"model.callbacks: {spec.class_path}: {err}") from None
        for cb in [*own, *listed]:
            if not isinstance(cb, pl.Callback):
                raise UserCodeError(f"model.callbacks: {type(cb).__name__} is not a pytorch_lightning Callback")
            cb.setup(module.trainer, module, "fit")
        return own, listed

    def _empty_slots(self) -> dict[str, VectorStore]:
        sizes = {"personal": self.layouts["personal"].size}
        for name, size in self.algorithm.client_slots.items():
            sizes[name] = self.layouts[size].size if isinstance(size, str) else int(size)
        e = self.cfg.engine
        memory = StateMemory(int(e.state_ram_mb * 2**20), e.spill_dir)  # one budget for all of a worker's slots
        return {name: VectorStore(size, memory) for name, size in sizes.items()}

    @staticmethod
    def _assigned_gpu() -> bool:
        return bool(ray.is_initialized() and ray.get_gpu_ids()) and torch.cuda.is_available()

    def device_info(self) -> dict:
        return {"device": str(self.fabric.device), "gpu_ids": ray.get_gpu_ids() if ray.is_initialized() else [],
                "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    # -- the port a client hook works through ----------------------------------------------------
    def initial(self, layout: str) -> np.ndarray:
        return self.plan.model.initial[layout]

    def parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.net.named_parameters())

    def stored(self, slot: str, client: int) -> np.ndarray | None:
        store = self.slots[slot]
        return store[client] if client in store else None

    def load_global(self, weights: np.ndarray) -> None:
        """Copy the received global weights into the model's shared part, unless it holds exactly them,
        untouched since they were loaded (torch's version counters see every in-place change)."""
        if self._held is not None and self._held[0] is weights and self._held[1] == self.layouts["shared"].version():
            return
        if self._resident is None or self._resident[0] is not weights:  # moved to the device once per broadcast
            self._resident = (weights, host_vector(weights, self.device))
        self.layouts["shared"].load(self._resident[1])
        self._held = (weights, self.layouts["shared"].version())

    def client_tensors(self, client: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        cd = self.client_data[client]
        idx = cd.train if split == "train" else cd.test
        images = self.data.train_x[idx] if split == "train" else self.data.test_x[idx]
        labels = self.data.train_y[idx] if split == "train" else self.data.test_y[idx]
        if cd.label_map is not None:
            labels = cd.label_map[labels]
        x = to_device(to_float(images, self.data.mean, self.data.std), self.device)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, to_device(torch.as_tensor(labels), self.device)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(mean loss, accuracy) of the model as it is on (x, y), in evaluation mode."""
        loss, acc, _ = self.loop.score(x, y, len(y) if self.algorithm.bn_mode == "batch_stats" else EVAL_BATCH, "")
        return loss, acc

    @cached_property
    def output_layer(self) -> torch.nn.Linear:
        return output_layer(self.net, self.plan.model.keys.head)

    def param_groups(self, parts: frozenset[str], round_idx: int) -> list[dict]:
        params = self.parameters()
        groups = []
        for part in ("body", "head"):
            tensors = [params[k] for k in self.layouts["full"].keys if k in params and self.part_of[k] == part]
            if part in parts and tensors:
                o = getattr(self.cfg.train, part)
                groups.append({"params": tensors, "lr": self.plan.lr(part, round_idx), "momentum": o.momentum,
                               "weight_decay": o.weight_decay})
        return groups

    def batches(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator):
        """One epoch of training batches of (x, y), as ``sgd`` draws them (order, crops and flips from
        ``generator``)."""
        self._held = None  # a method's own steps move the model off the received weights, BatchNorm statistics too
        return shuffled_batches(x, y, generator, self.cfg.train.batch_size, self.augment)

    def learning_rates(self, layout: str, round_idx: int) -> np.ndarray:
        params = dict(self.net.named_parameters())
        train = self.loop.sets["train"]
        lr_of = {id(p): override["lr"] for opt, overrides_ in zip(train.optimizers, self._group_settings(round_idx, False))
                 for group, override in zip(opt.param_groups, overrides_) for p in group["params"]}
        lay, out = self.layouts[layout], np.zeros(self.layouts[layout].size, np.float64)
        for key, _, start, end in lay.spans():
            if key in params:
                out[start:end] = lr_of.get(id(params[key]), 0.0)
        return out

    def _group_settings(self, round_idx: int, finetune: bool) -> list[list[dict]]:
        """Per optimizer and param group, what a local update of ``round_idx`` sets over configure_optimizers'
        values. The rule (docs/lightning.md): fedsim's own optimizers take train.body / train.head (eval.finetune_*
        when fine-tuning); a module's own keep their settings, their learning rates scaled by the part's round
        schedule (train.<part>.schedule) or, when fine-tuning, replaced by eval.finetune_lr if it is set."""
        e = self.cfg.eval
        chosen = self.loop.sets["finetune" if finetune else "train"]
        out = []
        for parts_of_groups, snapshots in zip(chosen.group_parts, chosen.snapshots):
            row = []
            for parts, snapshot in zip(parts_of_groups, snapshots):
                part = "body" if "body" in parts else "head"  # a group of both follows the body's schedule
                if not self.own_optimizers:
                    override = {"lr": self.plan.lr(part, round_idx, finetune)}
                elif finetune and e.finetune_lr is not None:
                    override = {"lr": e.finetune_lr, "initial_lr": e.finetune_lr}
                else:
                    scale = getattr(self.cfg.train, part).scale_at(round_idx, self.cfg.train.rounds)
                    override = {"lr": snapshot["lr"] * scale}
                    override |= {"initial_lr": snapshot["initial_lr"] * scale} if "initial_lr" in snapshot else {}
                row.append(override)
            out.append(row)
        return out

    def sgd(self, x: torch.Tensor, y: torch.Tensor, parts: frozenset[str], epochs: int, generator: torch.Generator,
            round_idx: int, penalty: Penalty | None = None, after_step: StepCallback | None = None,
            finetune: bool = False) -> list[torch.Tensor]:
        self._held = None  # training moves the model off the received weights (BatchNorm statistics too,
        #                   which torch's version counters do not see)
        batch = (self.cfg.eval.finetune_batch_size if finetune else None) or self.cfg.train.batch_size

        def epoch_batches():
            return shuffled_batches(x, y, generator, batch, self.augment)

        return self.loop.fit(epoch_batches, epochs, parts, self._group_settings(round_idx, finetune), penalty, after_step,
                             "finetune" if finetune else "train")

    # -- a round ---------------------------------------------------------------------------------
    def train_and_sum(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int,
                      plan: FixedPointScales) -> WorkerPartial:
        """Train ``clients`` and sum their weighted uploads exactly (fixed point, on the device): one partial per
        worker reaches the server, never a vector per client. A client whose loss is not finite or whose upload
        leaves the fixed-point range keeps nothing and is reported diverged."""
        sums = {name: ExactSum(scale, self.device) for name, scale in plan.scales.items()}
        weights = dict.fromkeys(plan.scales, 0)
        reports = []
        for client, t in zip(clients, self.train_clients(broadcast, clients, round_idx)):
            weight = {name: 1 if plan.uniform[name] else t.n_train for name in t.uploads}
            factor = plan.factors.get(client)
            loss, in_range = self._stage(sums, t, weight if factor is None else {n: w * factor for n, w in weight.items()})
            diverged = not np.isfinite(loss)
            kept = not diverged and in_range
            if kept:
                self.keep(client, t)
                for name in t.uploads:
                    sums[name].add()
                    weights[name] += weight[name]
            reports.append(ClientReport(client, t.n_train, loss, self._bytes_up(t) if kept else 0,
                                        diverged=not kept, out_of_range=not kept and not diverged, logged=t.logged))
        return WorkerPartial(reports, {name: s.total.cpu().numpy() for name, s in sums.items()}, weights)

    def train_and_reply(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> WorkerReplies:
        """Train ``clients`` and hand back each kept client's uploads (a server that sees replies: robust rules,
        methods that weigh one client against another). A client whose loss or any upload is not finite keeps
        nothing and is reported diverged."""
        reports, replies = [], []
        for client, t in zip(clients, self.train_clients(broadcast, clients, round_idx)):
            finite = [torch.isfinite(v).all() for v in t.uploads.values()]
            loss, fits = torch.stack([t.loss.double(), torch.stack(finite).all().double() if finite else
                                      torch.ones((), dtype=torch.float64, device=t.loss.device)]).tolist()
            kept = bool(np.isfinite(loss)) and bool(fits)
            if kept:
                self.keep(client, t)
                replies.append(Reply(client, t.n_train, {name: v.cpu().numpy() for name, v in t.uploads.items()}))
            reports.append(ClientReport(client, t.n_train, loss, self._bytes_up(t) if kept else 0, diverged=not kept,
                                        out_of_range=not kept and bool(np.isfinite(loss)), logged=t.logged))
        return WorkerReplies(reports, replies)

    @staticmethod
    def _stage(sums: dict[str, ExactSum], t: Trained, weight: dict[str, float]) -> tuple[float, bool]:
        """Stage every upload in its sum, then read the client's loss and whether all its uploads are within
        range: one host synchronisation per client for both."""
        staged = [sums[name].stage(vector, weight[name]) for name, vector in t.uploads.items()]
        in_range = torch.stack(staged).all() if staged else torch.ones((), dtype=torch.bool, device=t.loss.device)
        loss, fits = torch.stack([t.loss.double(), in_range.double()]).tolist()
        return loss, bool(fits)

    @staticmethod
    def _bytes_up(t: Trained) -> int:
        """The serialised size of the uploads, from their lengths (nothing is pickled per client)."""
        return sum(payload_bytes(v.numel()) for v in t.uploads.values())  # float32 vectors

    def train_clients(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> Iterator[Trained]:
        """Each client's round, in order: one after another, or (engine.pack) a pack at a time."""
        if self.trainer is None:
            yield from (self.train_client(broadcast, client, round_idx) for client in clients)
            return
        size = self.pack_size if self.pack_size != "auto" else self.auto_pack_size()
        for start in range(0, len(clients), size):
            yield from self.train_pack(broadcast, clients[start:start + size], round_idx)

    def train_pack(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> list[Trained]:
        """The algorithm's client hook for each of ``clients``, their local training packed (fedsim.client.packed)."""
        def hook(client: int) -> Callable[[Any], Trained]:
            def run(thread) -> Trained:
                port = PackedClient(self, thread, self.plan.model.initial["full"])
                ctx = ClientContext(port, client, round_idx, broadcast, client_generator(self.cfg.seed, round_idx, client))
                return self._trained(ctx, self.algorithm.client_update(ctx), {})
            return run

        return in_lockstep([hook(client) for client in clients], self._serve_training)

    def _serve_training(self, requests: list[TrainRequest]) -> list[list[torch.Tensor]]:
        """Local training for every parked client of a pack, those asking for the same update together."""
        losses: dict[int, list[torch.Tensor]] = {}
        by_kind: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            by_kind.setdefault(r.kind, []).append(i)
        for (parts, _, round_idx), members in by_kind.items():
            trained = [k for k in self.layouts["full"].keys if k in self.parameter_keys and self.part_of[k] in parts]
            hyper = {k: self.sgd_settings(self.part_of[k], round_idx) for k in trained}
            got = self.trainer.fit([requests[i] for i in members], trained, hyper, self.cfg.train.batch_size,
                                   self.augment)
            losses |= dict(zip(members, got))
        return [losses[i] for i in range(len(requests))]

    def sgd_settings(self, part: str, round_idx: int) -> Hyper:
        """fedsim's own SGD settings of ``part`` in a local update of ``round_idx`` (what sequential training's
        optimizers use)."""
        o = getattr(self.cfg.train, part)
        return Hyper(self.plan.lr(part, round_idx), o.momentum, o.weight_decay)

    def auto_pack_size(self) -> int:
        """engine.pack: auto -- measured once on this worker's device (fedsim.client.packsize); never changes
        results, since any pack size >= 2 computes the same."""
        if self._auto_pack is None:
            self._auto_pack = choose_pack_size(self, self.cfg.engine.gpus_per_worker)
        return self._auto_pack

    def train_client(self, broadcast: dict[str, np.ndarray], client: int, round_idx: int) -> Trained:
        """The algorithm's client hook for one client: its loss, its uploads (on the device) and the per-client
        state it staged, none of it kept yet (``keep`` does that for a client whose round counts)."""
        self._working_on(client, round_idx, "training")
        ctx = ClientContext(self, client, round_idx, broadcast, client_generator(self.cfg.seed, round_idx, client))
        return self._trained(ctx, self.algorithm.client_update(ctx), self.loop.logged.collect())

    def _trained(self, ctx: ClientContext, losses: list[torch.Tensor], logged: dict[str, float]) -> Trained:
        if set(ctx.uploads) != set(self.algorithm.uploads):
            raise RuntimeError(f"algorithm {self.algorithm.name}: client {ctx.client} uploaded {sorted(ctx.uploads)}, "
                               f"it declares {sorted(self.algorithm.uploads)}")
        # The mean stays on the device: the caller reads it with the range test. A client whose loss is not
        # finite keeps nothing of its round; the server decides stop or drop.
        return Trained(len(self.client_data[ctx.client].train), torch.stack(losses).mean(), ctx.uploads, ctx.slots,
                       logged)

    def keep(self, client: int, trained: Trained) -> None:
        """The client's round counts: its staged per-client state becomes its state."""
        for name, vector in trained.slots.items():
            self.slots[name][client] = vector

    # -- persistence (checkpoints are written by the owner; personal state never reaches the server) --
    def save_state(self, target: str, full: bool = True) -> str:
        """Write this worker's clients to ``target`` (a local path, or a URI in the run's object store): all of
        them, or (``full=False``) those changed since the checkpoint it last wrote or loaded. Returns the file's
        digest, which the checkpoint's state.json records."""
        with storage.local_output(target) as path:
            digest = write_worker_state(path, self.slots if full else {name: dict(store.changed_items())
                                                                       for name, store in self.slots.items()})
        for store in self.slots.values():
            store.mark_saved()
        return digest

    def load_state(self, ckpt: str | None) -> None:
        """Restore this worker's clients from a checkpoint (None: the round-0 state; a URI is downloaded)."""
        self.slots = self._empty_slots()
        with local_checkpoint(ckpt) as local:
            for name, client, vector in worker_vectors(local, set(self.client_data)) if local else ():
                store = self.slots.get(name)
                if store is None or vector.size != store.size:
                    raise CheckpointError(f"{ckpt}: per-client state {name!r} does not fit this model and algorithm; "
                                          "resume with the run's own config")
                store[client] = vector
        for store in self.slots.values():
            store.mark_saved()  # equal to the checkpoint: the next delta builds on it

    # -- evaluation ------------------------------------------------------------------------------
    def _score(self, client: int, suffix: str = "") -> dict[str, float]:
        x, y = self.client_tensors(client, "test")
        # Batch statistics depend on the batch: score a client's whole test set at once, as FedBABU's authors.
        batch = len(y) if self.algorithm.bn_mode == "batch_stats" else EVAL_BATCH
        loss, acc, logged = self.loop.score(x, y, batch, suffix)
        return {f"loss{suffix}": loss, f"acc{suffix}": acc, **logged}

    def evaluate(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> list[dict]:
        """FedBABU's protocol for every algorithm: *initial* accuracy of the model the client is scored with,
        and *personalized* accuracy after personalizing it (``_personalize``) on its own training data. That
        works on the loaded copy and is never packed back. A module's validation_step / test_step logs join the
        record (``_personalized`` after personalizing, what it logs while personalizing ``_finetune``)."""
        results = []
        for client in clients:
            cd = self.client_data[client]
            self._working_on(client, round_idx, "evaluation")
            gen = client_generator(self.cfg.seed, round_idx, client, FINETUNE_STREAM)
            ctx = ClientContext(self, client, round_idx, broadcast, gen)
            self.algorithm.load_for_evaluation(ctx)
            with self._adjusted_logits(ctx.logit_adjustment):
                rec = {"client": client, "n_train": len(cd.train), "n_test": len(cd.test), **self._score(client)}
                if self.cfg.eval.personalizes:
                    self._personalize(ctx, gen)
                    rec |= self.loop.logged.collect("_finetune")
                    rec |= self._score(client, "_personalized")
            results.append(rec)
        return results

    def _personalize(self, ctx: ClientContext, gen: torch.Generator) -> None:
        """eval.personalize: finetune runs eval.finetune_epochs of the fine-tuning optimizer on eval.finetune_part;
        own_update runs the method's own client hook from the global model and the client's own state, at train's
        settings, as FedRep's authors score FedRep. Its uploads and staged state are dropped: nothing of it is kept."""
        ecfg = self.cfg.eval
        if ecfg.personalize == "own_update":
            self.algorithm.client_update(ClientContext(self, ctx.client, ctx.round, ctx.broadcast, gen))
            return
        x, y = ctx.data()
        self.sgd(x, y, PARTS[ecfg.finetune_part], ecfg.finetune_epochs, gen, ctx.round, finetune=True)

    @contextmanager
    def _adjusted_logits(self, adjust: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None) -> Iterator[None]:
        """A method's scoring logits (``ClientContext.score_with``) for one client's evaluation, then the network's own."""
        if adjust is None:
            yield
            return
        handle = self.output_layer.register_forward_hook(lambda _, inputs, logits: adjust(inputs[0], logits))
        try:
            yield
        finally:
            handle.remove()

    def _working_on(self, client: int, round_idx: int, what: str) -> None:
        """Tell the loop (its error messages, and the module's ``self.trainer.fedsim``) who is at work."""
        self.loop.where = f" (client {client}, round {round_idx}, {what})"
        self.fabric.fedsim = {"client": client, "round": round_idx, "stage": what}
