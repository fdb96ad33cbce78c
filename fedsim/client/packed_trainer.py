"""Local SGD of a pack of clients (engine.pack) as one batched computation over the network's packed form
(``fedsim.models.packed``): every client with its own data order and augmentation draws (its own generator, drawn
in the order of sequential training), its own optimizer state, BatchNorm statistics and penalty.

What a client computes does not depend on its pack-mates or its place in the pack (a lone client is computed
beside a copy of itself, never as a pack of one), so results are the same for any pack size and any number of
workers. They differ in the last bits from sequential training, whose kernels are the ungrouped ones.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from fedsim.algorithms.context import LinearTerm, Penalty, Proximal
from fedsim.client.settings import Hyper
from fedsim.data import crop_flip
from fedsim.data.transforms import CropFlipDraws, epoch_draws, to_device
from fedsim.errors import UserCodeError
from fedsim.models.packed import PackedNet


@dataclass
class TrainRequest:
    """What a packed client's hook asked for: ``ctx.sgd`` with these arguments, on the client's own tensors."""
    state: dict[str, torch.Tensor]  # by state-dict key; trained in place
    x: torch.Tensor
    y: torch.Tensor
    parts: frozenset[str]
    epochs: int
    generator: torch.Generator
    round_idx: int
    penalty: Penalty | None

    @property
    def kind(self) -> tuple:
        return self.parts, self.epochs, self.round_idx


Batch = tuple[torch.Tensor, CropFlipDraws | None]  # sample indices into the pack's data, crop/flip draws


def _schedule(request: TrainRequest, offset: int, batch: int, augment: bool) -> list[Batch]:
    """A client's batches over all its epochs, drawn as sequential training draws them (:func:`epoch_draws`), as
    indices into the pack's concatenated data."""
    return [(idx + offset, draws) for _ in range(request.epochs)
            for idx, draws in epoch_draws(len(request.y), request.generator, batch, augment)]


class PackedTrainer:
    """Local SGD of many clients as one batched computation over a network's packed form."""

    def __init__(self, net: torch.nn.Module, keys: tuple[str, ...], parameter_keys: frozenset[str],
                 channels_last: bool):
        self.packed = PackedNet(net, channels_last)
        self.keys = keys
        self.parameter_keys = parameter_keys

    def fit(self, requests: list[TrainRequest], trained: list[str], hyper: Mapping[str, Hyper], batch: int,
            augment: bool) -> list[list[torch.Tensor]]:
        """Train ``trained`` (keys) of every requesting client; their states are updated in place. Returns each
        client's per-step losses (the data loss, as sequential training reports it)."""
        with torch.no_grad():
            stacked = {k: torch.stack([r.state[k] for r in requests]) for k in self.keys}
        data = (torch.cat([r.x for r in requests]), torch.cat([r.y for r in requests]))
        offsets = np.cumsum([0, *(len(r.y) for r in requests)])
        schedules = [_schedule(r, int(offset), batch, augment) for r, offset in zip(requests, offsets)]
        momentum = {k: torch.zeros_like(stacked[k]) for k in trained if hyper[k].momentum}
        penalties = _StackedPenalties([r.penalty for r in requests], stacked)
        losses: list[list[torch.Tensor]] = [[] for _ in requests]
        for step in range(max(map(len, schedules), default=0)):
            by_size: dict[int, list[int]] = {}
            for i, schedule in enumerate(schedules):
                if step < len(schedule):
                    by_size.setdefault(len(schedule[step][0]), []).append(i)
            for rows in by_size.values():
                batches = [schedules[i][step] for i in rows]
                per_client = self._step(rows, batches, data, stacked, momentum, trained, hyper, penalties,
                                        len(requests))
                for i, loss in zip(rows, per_client):
                    losses[i].append(loss)
        with torch.no_grad():
            for k in self.keys:
                for i, r in enumerate(requests):
                    r.state[k].copy_(stacked[k][i])
        return losses

    @staticmethod
    def _inputs(batches: list[Batch], data: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batches of a step as (G, B, ...) inputs and labels: one gather and one crop/flip for the pack."""
        x_all, y_all = data
        idx = to_device(torch.cat([b[0] for b in batches]), x_all.device)
        x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
        draws = [b[1] for b in batches if b[1] is not None]  # all or none: data.augment holds for the whole pack
        if draws:
            dy, dx, flip = (torch.cat(parts) for parts in zip(*draws))
            x = crop_flip(x, dy, dx, flip)
        return x.view(len(batches), -1, *x.shape[1:]), y.view(len(batches), -1)

    def _step(self, rows: list[int], batches: list[Batch], data: tuple[torch.Tensor, torch.Tensor],
              stacked: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor], trained: list[str],
              hyper: Mapping[str, Hyper], penalties: _StackedPenalties, pack: int) -> torch.Tensor:
        """One SGD step of the clients ``rows`` (all with batches of one size); their data losses."""
        n = len(rows)
        if n == 1:  # never a pack of one: it would take other kernels than the same client among others
            rows, batches = rows * 2, batches * 2
        whole = rows == list(range(pack))
        index = torch.tensor(rows, device=next(iter(stacked.values())).device)
        state = {k: (t if whole else t.index_select(0, index)) for k, t in stacked.items()}
        for k in trained:
            state[k] = state[k].detach().requires_grad_(True)
        x, y = self._inputs(batches, data)
        logits = self.packed(x, state, training=True)
        per_client = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                     reduction="none").view(len(rows), -1).mean(1)[:n]
        total = per_client.sum() + penalties.value(state, index[:n])
        grads = torch.autograd.grad(total, [state[k] for k in trained])
        with torch.no_grad():
            real = index[:n]
            if not whole:  # statistics were updated in copies: write them back
                for k, t in stacked.items():
                    if k not in self.parameter_keys:
                        t.index_copy_(0, real, state[k][:n])
            self._sgd(stacked, momentum, {k: g[:n] for k, g in zip(trained, grads)}, hyper, None if whole else real)
        return per_client.detach()

    @staticmethod
    def _sgd(stacked: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
             hyper: Mapping[str, Hyper], rows: torch.Tensor | None) -> None:
        """torch.optim.SGD's step on ``rows`` of the stacked tensors (every row when None), as multi-tensor (foreach)
        operations over the tensors that share settings. Momentum buffers start at zero, which gives torch's first
        step (the gradient itself) exactly. Every product is its own operation: a fused ``add(alpha=...)`` rounds
        once in its vectorised loop and twice in its scalar tail, so a value's result would depend on where its
        slot lies in the stack."""
        by_setting: dict[Hyper, list[str]] = {}
        for k in grads:
            by_setting.setdefault(hyper[k], []).append(k)
        for h, keys in by_setting.items():
            params = [_rows(stacked[k], rows) for k in keys]
            d: list[torch.Tensor] | tuple[torch.Tensor, ...] = [grads[k] for k in keys]
            if h.weight_decay:
                d = torch._foreach_add(d, torch._foreach_mul(params, h.weight_decay))
            if h.momentum:
                bufs = [_rows(momentum[k], rows) for k in keys]
                torch._foreach_mul_(bufs, h.momentum)
                torch._foreach_add_(bufs, d)
                d = bufs
                _write_rows([momentum[k] for k in keys], bufs, rows)
            torch._foreach_sub_(params, torch._foreach_mul(d, h.lr))
            _write_rows([stacked[k] for k in keys], params, rows)


def _rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """The stacked tensor itself (every row), or a copy of ``rows`` of it."""
    return t if rows is None else t.index_select(0, rows)


def _write_rows(targets: list[torch.Tensor], values: list[torch.Tensor], rows: torch.Tensor | None) -> None:
    """Put copies taken by :func:`_rows` back (nothing to do when they were the tensors themselves)."""
    if rows is not None:
        for t, v in zip(targets, values):
            t.index_copy_(0, rows, v)


class _StackedPenalties:
    """The pack's penalties (ctx.proximal's and ctx.linear's), stacked over its clients: a client without one
    contributes zeros, which add nothing to its gradient."""

    def __init__(self, penalties: list[Penalty | None], stacked: dict[str, torch.Tensor]):
        self.terms: list[tuple[str, str, torch.Tensor, torch.Tensor]] = []  # (kind, key, coefs, anchors or values)
        others = [p for p in penalties if p is not None and type(p) not in (Proximal, LinearTerm)]
        if others:  # a subclass may compute something else when called: only the two known terms are stacked
            raise UserCodeError(f"engine.pack: a penalty of type {type(others[0]).__name__} cannot be packed; build "
                                "penalties with ctx.proximal / ctx.linear, or set engine.pack: 1")
        for kind in (Proximal, LinearTerm):
            mine = [p if type(p) is kind else None for p in penalties]
            if any(mine):
                self.terms += self._stack(kind, mine, stacked)

    @staticmethod
    def _stack(kind: type, mine: list, stacked: dict[str, torch.Tensor]) -> list:
        key_sets = {tuple(p.anchors if kind is Proximal else p.coefs) for p in mine if p is not None}
        if len(key_sets) > 1:
            raise UserCodeError(f"engine.pack: the clients of a pack built {kind.__name__} penalties over different "
                                "parameters, which cannot be stacked; set engine.pack: 1")
        keys = key_sets.pop()
        terms = []
        for k in keys:
            zeros = torch.zeros_like(stacked[k][0])
            if kind is Proximal:
                coefs = torch.tensor([0.0 if p is None else p.coef for p in mine], device=zeros.device)
                values = torch.stack([zeros if p is None else p.anchors[k] for p in mine])
            else:
                coefs = torch.empty(0)
                values = torch.stack([zeros if p is None else p.coefs[k] for p in mine])
            terms.append(("proximal" if kind is Proximal else "linear", k, coefs, values))
        return terms

    def value(self, state: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | float:
        total: torch.Tensor | float = 0.0
        n = len(rows)
        for kind, k, coefs, values in self.terms:
            w = state[k][:n]
            v = values.index_select(0, rows)
            if kind == "proximal":
                total = total + (coefs.index_select(0, rows) / 2 * ((w - v) ** 2).flatten(1).sum(1)).sum()
            else:
                total = total + (w * v).sum()
        return total
