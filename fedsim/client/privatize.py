"""User-level DP on the worker (``fedsim.privacy.mechanism`` says what is guaranteed): each client's update of the
shared part, its WEIGHTS upload minus the broadcast weights it started from, clipped to L2 norm C over all shared
tensors jointly, and under local DP noised with the client's own stream, before the upload is staged for the
worker's exact sum. Only the upload is touched: personal parts and per-client slots never leave the client and are
neither clipped nor noised."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from fedsim.client.reduce import Trained
from fedsim.client.resident import host_vector
from fedsim.core.protocol import WEIGHTS
from fedsim.privacy.mechanism import UserLevelDP
from fedsim.privacy.noise import local_noise


def clipped(trained: Trained, started_from: torch.Tensor, clip_norm: float, noise: np.ndarray | None) -> Trained:
    """``trained`` with its WEIGHTS upload started_from + min(1, C / ||update||) update (+ ``noise``), in float64
    (``started_from`` is) then float32, and the update's norm before clipping (on the device: read with the client's
    loss)."""
    update = trained.uploads[WEIGHTS].double() - started_from
    norm = torch.linalg.vector_norm(update)
    update *= torch.clamp(clip_norm / norm, max=1.0)  # a zero update: C / 0 = inf, clamped to 1
    if noise is not None:
        update += torch.from_numpy(noise).to(update.device)
    private = (started_from + update).float()
    return dataclasses.replace(trained, uploads={**trained.uploads, WEIGHTS: private}, update_norm=norm)


def privatized(rounds: Iterable[Trained], clients: list[int], broadcast: dict[str, np.ndarray], round_idx: int,
               clip_norm: float | None, dp: UserLevelDP | None, device: torch.device) -> Iterator[Trained]:
    """Each client's round as DP lets it leave (as it is without DP: ``clip_norm`` None)."""
    if clip_norm is None or dp is None:
        yield from rounds
        return
    started_from = host_vector(broadcast[WEIGHTS], device).double()  # once per worker and round
    std = dp.local_std(clip_norm)
    for client, trained in zip(clients, rounds):
        noise = local_noise(dp.seed, round_idx, client, started_from.numel(), std) if std else None
        yield clipped(trained, started_from, clip_norm, noise)
