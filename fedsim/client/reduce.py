"""What a worker hands the server of its clients' round: their uploads summed exactly (``ClientSums``) or each kept
client's own (``ClientReplies``), and a report per client. One loop (:func:`reduce_clients`) decides which clients
count; the two reductions differ only in what they stage and keep."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedsim.client.resident import ExactSum, host_vector
from fedsim.core.protocol import ClientReport, Reply, FixedPointScales, WorkerPartial, WorkerReplies, payload_bytes
from fedsim.privacy.secagg import PairwiseMasks


@dataclass(frozen=True)
class Trained:
    """One client's round on this worker, before the runtime keeps or sums it."""
    n_train: int
    loss: torch.Tensor  # a scalar on the worker's device, read by the caller together with its other answers
    uploads: dict[str, torch.Tensor]  # on the worker's device
    slots: dict[str, np.ndarray]  # staged per-client state
    logged: dict[str, float]  # what the module's self.log recorded in this round's training
    update_norm: torch.Tensor | None = None  # under DP: the norm of its shared update before clipping (on the device)

    def bytes_up(self) -> int:
        """The serialised size of the uploads, from their lengths (nothing is pickled per client)."""
        return sum(payload_bytes(v.numel()) for v in self.uploads.values())  # float32 vectors


class Reduction(Protocol):
    """Where a worker's kept clients' uploads go."""

    def stage(self, client: int, trained: Trained) -> torch.Tensor:
        """Prepare the client's uploads; a boolean scalar on the device: whether they can be taken."""

    def add(self, client: int, trained: Trained) -> None:
        """Take the staged uploads of a client whose round counts."""


def reduce_clients(clients: list[int], rounds: Iterable[Trained], into: Reduction,
                   keep: Callable[[int, Trained], None]) -> list[ClientReport]:
    """Each client's round into ``into`` and its state kept (``keep``), or, for a client whose loss is not finite
    or whose uploads cannot be taken, nothing kept and the client reported diverged. One host synchronisation per
    client reads its loss, whether its uploads fit and, under DP, its update's norm before clipping."""
    reports = []
    for client, t in zip(clients, rounds):
        norm = [] if t.update_norm is None else [t.update_norm.double()]
        loss, fits, *norms = torch.stack([t.loss.double(), into.stage(client, t).double(), *norm]).tolist()
        finite = bool(np.isfinite(loss))
        kept = finite and bool(fits)
        if kept:
            keep(client, t)
            into.add(client, t)
        reports.append(ClientReport(client, t.n_train, loss, t.bytes_up() if kept else 0, diverged=not kept,
                                    out_of_range=not kept and finite, logged=t.logged,
                                    update_norm=norms[0] if norms else None))
    return reports


def _all(flags: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool, device=device)


class ClientSums:
    """The weighted uploads summed exactly (fixed point, on the device): one partial per worker reaches the server,
    never a vector per client. An upload that leaves the fixed-point range cannot be taken."""

    def __init__(self, scaling: FixedPointScales, device: torch.device, masks: PairwiseMasks | None = None):
        self.scaling = scaling
        self.sums = {name: ExactSum(scale, device) for name, scale in scaling.scales.items()}
        self.weights = dict.fromkeys(scaling.scales, 0)
        self.masks = masks  # secure aggregation: each client's quanta are masked before they enter the sums
        self.device = device

    def _weight(self, trained: Trained) -> dict[str, int]:
        return {name: 1 if self.scaling.uniform[name] else trained.n_train for name in trained.uploads}

    def stage(self, client: int, trained: Trained) -> torch.Tensor:
        weight: dict[str, float] = dict(self._weight(trained))
        factor = self.scaling.factors.get(client)
        if factor is not None:
            weight = {name: w * factor for name, w in weight.items()}
        staged = [self.sums[name].stage(vector, weight[name]) for name, vector in trained.uploads.items()]
        return _all(staged, trained.loss.device)

    def add(self, client: int, trained: Trained) -> None:
        masks = self._masks(client)
        for name, weight in self._weight(trained).items():
            self.sums[name].add(masks.get(name))
            self.weights[name] += weight

    def _masks(self, client: int) -> dict[str, torch.Tensor]:
        """The client's pairwise masks on the device, per upload (none without secure aggregation)."""
        if self.masks is None:
            return {}
        words = self.masks.mask(client, {name: s.total.numel() for name, s in self.sums.items()})
        return {name: host_vector(w.view(np.int64), self.device) for name, w in words.items()}

    def partial(self, reports: list[ClientReport]) -> WorkerPartial:
        return WorkerPartial(reports, {name: s.total.cpu().numpy() for name, s in self.sums.items()}, self.weights)


class ClientReplies:
    """Each kept client's uploads, handed back as they are (a server that sees replies: robust rules, methods that
    weigh one client against another). An upload with a value that is not finite cannot be taken."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []

    def stage(self, client: int, trained: Trained) -> torch.Tensor:
        return _all([torch.isfinite(v).all() for v in trained.uploads.values()], trained.loss.device)

    def add(self, client: int, trained: Trained) -> None:
        self.replies.append(Reply(client, trained.n_train, {name: v.cpu().numpy() for name, v in trained.uploads.items()}))

    def answer(self, reports: list[ClientReport]) -> WorkerReplies:
        return WorkerReplies(reports, self.replies)
