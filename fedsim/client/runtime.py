"""The torch side of a worker: many virtual clients in one model.

A client is only state: its data indices (and label map) plus the named per-client slots its algorithm keeps
(``fedsim.client.states``). Training a client = the algorithm's client hook run on a
:class:`~fedsim.algorithms.context.ClientContext` over the one model; this runtime is the context's
:class:`~fedsim.algorithms.context.RuntimePort`, and wires the worker's other roles together: its set-up
(``setup``), the optimizer settings of a round (``settings``), the local update (``loop``), what a round hands the
server (``reduce``), packed training (``packing``) and the evaluation protocol (``evaluation``).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from functools import cached_property

import numpy as np
import ray
import torch

from fedsim.algorithms.context import ClientContext, PackablePort, Penalty, RuntimePort, StepCallback
from fedsim.client.evaluation import Evaluation
from fedsim.client.logged import recorded
from fedsim.client.packing import Packing
from fedsim.client.privatize import privatized
from fedsim.client.randomness import client_generator, global_draws
from fedsim.client.reduce import ClientReplies, ClientSums, Trained, reduce_clients
from fedsim.client.resident import host_vector, to_device
from fedsim.client.setup import configure_process, set_up_worker
from fedsim.client.states import ClientStates
from fedsim.core.protocol import ClientData, ClientRecord, FixedPointScales, WorkerPartial, WorkerReplies
from fedsim.core.store import VectorStore
from fedsim.data import ArrayDataset, load_run_data, shuffled_batches
from fedsim.data.client_split import client_tensors
from fedsim.models.state import output_layer
from fedsim.plan import WorkerPlan
from fedsim.privacy.secagg import PairwiseMasks


class ClientRuntime:
    """Plain-Python core of a worker (the Ray actor in ``fedsim.client.worker`` wraps it)."""

    def __init__(self, plan: WorkerPlan, client_data: dict[int, ClientData]):
        self.plan = plan
        self.cfg = cfg = plan.cfg
        self.algorithm = plan.algorithm
        configure_process(cfg)
        d = cfg.data
        self.data: ArrayDataset = load_run_data(d, cfg.seed)
        self.augment = d.augment and self.data.augmentable
        self.client_data = client_data
        self.local_epochs = cfg.train.local_epochs
        # The client module from the seed, as the driver built it; its values are the plan's round-0 model.
        self.model = model = set_up_worker(plan)
        self.net, self.loop, self.device, self.layouts = model.net, model.loop, model.device, model.layouts
        self.channels_last, self.settings = model.channels_last, model.settings
        self.states = ClientStates(self._slot_sizes(), cfg.engine, set(client_data))
        pack_size, _ = plan.packing
        self.packing = None if pack_size == 1 else Packing(
            model, pack_size, self.algorithm.name, cfg.train.batch_size, self.augment, plan.input_shape,
            cfg.engine.gpus_per_worker)
        self.evaluation = Evaluation(self, self.loop, self.algorithm, cfg, client_data, perplexity=self.data.window > 0)
        self._held: tuple[np.ndarray, int] | None = None  # (broadcast weights in the model, their tensors' version)
        self._resident: tuple[np.ndarray, torch.Tensor] | None = None  # (broadcast weights, their copy on the device)

    def _slot_sizes(self) -> dict[str, int]:
        sizes = {"personal": self.layouts["personal"].size}
        for name, size in self.algorithm.client_slots.items():
            sizes[name] = self.layouts[size].size if isinstance(size, str) else int(size)
        return sizes

    @property
    def slots(self) -> dict[str, VectorStore]:
        """Every client's kept per-client state, by slot."""
        return self.states.slots

    def device_info(self) -> dict:
        return {"device": str(self.device), "gpu_ids": ray.get_gpu_ids() if ray.is_initialized() else [],
                "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    # -- the port a client hook works through ----------------------------------------------------
    def whole_runtime(self, what: str) -> RuntimePort:
        return self

    def initial(self, layout: str) -> np.ndarray:
        return self.plan.model.initial[layout]

    def parameters(self) -> dict[str, torch.Tensor]:
        return dict(self.net.named_parameters())

    def stored(self, slot: str, client: int) -> np.ndarray | None:
        return self.states.stored(slot, client)

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
        images, labels = client_tensors(self.data, self.client_data[client], split)  # what client_split gives a user
        x = to_device(images, self.device)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, to_device(labels, self.device)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        return self.evaluation.score(x, y)

    @cached_property
    def output_layer(self) -> torch.nn.Linear:
        return output_layer(self.net, self.plan.model.keys.head)

    def param_groups(self, parts: frozenset[str], round_idx: int) -> list[dict]:
        params = self.parameters()
        tensors = {part: [params[k] for k in self.model.trainable(frozenset({part}))] for part in ("body", "head")}
        return self.settings.param_groups(tensors, parts, round_idx)

    def batches(self, x: torch.Tensor, y: torch.Tensor,
                generator: torch.Generator) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of training batches of (x, y), as ``sgd`` draws them (order, crops and flips from
        ``generator``)."""
        self._held = None  # a method's own steps move the model off the received weights, BatchNorm statistics too
        return shuffled_batches(x, y, generator, self.cfg.train.batch_size, self.augment)

    def learning_rates(self, layout: str, round_idx: int) -> np.ndarray:
        params = dict(self.net.named_parameters())
        lr_of = self.settings.learning_rates(self.loop.sets["train"], round_idx)
        lay, out = self.layouts[layout], np.zeros(self.layouts[layout].size, np.float64)
        for key, _, start, end in lay.spans():
            if key in params:
                out[start:end] = lr_of.get(id(params[key]), 0.0)
        return out

    def sgd(self, x: torch.Tensor, y: torch.Tensor, parts: frozenset[str], epochs: int, generator: torch.Generator,
            round_idx: int, penalty: Penalty | None = None, after_step: StepCallback | None = None,
            finetune: bool = False) -> list[torch.Tensor]:
        self._held = None  # training moves the model off the received weights (BatchNorm statistics too,
        #                   which torch's version counters do not see)
        batch = (self.cfg.eval.finetune_batch_size if finetune else None) or self.cfg.train.batch_size
        stage = "finetune" if finetune else "train"

        def epoch_batches() -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
            return shuffled_batches(x, y, generator, batch, self.augment)

        return self.loop.fit(epoch_batches, epochs, parts, self.settings.overrides(self.loop.sets[stage], round_idx,
                                                                                   finetune),
                             penalty, after_step, stage)

    # -- a round ---------------------------------------------------------------------------------
    def train_and_sum(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int,
                      scaling: FixedPointScales, masks: PairwiseMasks | None = None) -> WorkerPartial:
        """Train ``clients`` and sum their weighted uploads exactly (``reduce.ClientSums``): under DP each client's
        shared update clipped (and under local DP noised) first (``privatize``), under secure aggregation each
        masked (``masks``)."""
        sums = ClientSums(scaling, self.device, masks)
        rounds = privatized(self.train_clients(broadcast, clients, round_idx), clients, broadcast, round_idx,
                            scaling.clip_norm, self.plan.user_level_dp, self.device)
        return sums.partial(reduce_clients(clients, rounds, sums, self.keep))

    def train_and_reply(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> WorkerReplies:
        """Train ``clients`` and hand back each kept client's uploads (``reduce.ClientReplies``)."""
        replies = ClientReplies()
        return replies.answer(reduce_clients(clients, self.train_clients(broadcast, clients, round_idx), replies,
                                             self.keep))

    def train_clients(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> Iterator[Trained]:
        """Each client's round, in order: one after another, or (engine.pack) a pack at a time."""
        if self.packing is None:
            yield from (self.train_client(broadcast, client, round_idx) for client in clients)
            return
        yield from self.packing.train(self, clients, lambda client, port: self._client_update(
            port, client, round_idx, broadcast, {}))

    def train_client(self, broadcast: dict[str, np.ndarray], client: int, round_idx: int) -> Trained:
        """The algorithm's client hook for one client: its loss, its uploads (on the device) and the per-client
        state it staged, none of it kept yet (``keep`` does that for a client whose round counts)."""
        self.loop.working_on(client, round_idx, "training")
        return self._client_update(self, client, round_idx, broadcast, None)

    def _client_update(self, port: PackablePort, client: int, round_idx: int, broadcast: dict[str, np.ndarray],
                       logged: dict[str, float] | None) -> Trained:
        """The algorithm's client hook on ``port``; ``logged``: what the module logged (None: read from the loop)."""
        ctx = ClientContext(port, client, round_idx, broadcast, client_generator(self.cfg.seed, round_idx, client))
        with global_draws(self.cfg.seed, round_idx, client):
            losses = self.algorithm.client_update(ctx)
        if logged is None:
            logged = self.loop.logged.collect()
        logged = {**logged, **recorded(self.algorithm.name, ctx.recorded)}
        if set(ctx.uploads) != set(self.algorithm.uploads):
            raise RuntimeError(f"algorithm {self.algorithm.name}: client {ctx.client} uploaded {sorted(ctx.uploads)}, "
                               f"it declares {sorted(self.algorithm.uploads)}")
        # The mean stays on the device: the caller reads it with the range test. A client whose loss is not
        # finite keeps nothing of its round; the server decides stop or drop.
        return Trained(len(self.client_data[ctx.client].train), torch.stack(losses).mean(), ctx.uploads, ctx.slots,
                       logged)

    def keep(self, client: int, trained: Trained) -> None:
        """The client's round counts: its staged per-client state becomes its state."""
        self.states.keep(client, trained.slots)

    # -- persistence (checkpoints are written by the owner; personal state never reaches the server) --
    def save_state(self, target: str, full: bool = True) -> str:
        """Write this worker's clients to ``target``; the file's digest (``states.ClientStates.save``)."""
        return self.states.save(target, full)

    def load_state(self, ckpt: str | None) -> None:
        """Restore this worker's clients from a checkpoint (None: the round-0 state)."""
        self.states.load(ckpt)

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int) -> list[ClientRecord]:
        """FedBABU's protocol for every algorithm (``evaluation.Evaluation``)."""
        return self.evaluation.evaluate(broadcast, clients, round_idx)
