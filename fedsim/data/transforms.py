"""Batched image transforms: one tensor op per batch instead of a Python call per image."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

CropFlipDraws = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # per image: row offset, column offset, flip


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; from the host to an accelerator without making the host wait for the device's
    queue (a pinned staging copy, then an asynchronous transfer). Random draws come from CPU generators (the
    same numbers on every device) and reach the device this way."""
    if t.device.type != "cpu" or device.type == "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def to_float(x_nhwc: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(B, H, W, C) -> normalised float32 (B, C, H, W): ``(x / 255 - mean) / std`` for uint8 images,
    ``(x - mean) / std`` for float features."""
    # np.array copies: batches often come straight from a read-only memory map, which torch
    # refuses to wrap without a warning.
    x = torch.from_numpy(np.array(x_nhwc)).permute(0, 3, 1, 2)
    scale = 255 if x.dtype == torch.uint8 else 1
    x = x.to(torch.float32, memory_format=torch.contiguous_format).div_(scale)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return x.sub_(mean_t).div_(std_t)


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Standard CIFAR augmentation: zero-pad, random crop back to (H, W), horizontal flip p=0.5.

    Each image gets its own offsets and flip, drawn from ``generator`` alone so a seeded
    generator reproduces the batch. Zero padding happens after normalisation (pads with the
    mean colour rather than black), which is the common batched variant and trains the same.
    """
    return crop_flip(x, *crop_flip_draws(len(x), generator, padding), padding)


def crop_flip_draws(b: int, generator: torch.Generator, padding: int = 4) -> CropFlipDraws:
    """The random part of :func:`random_crop_flip` for ``b`` images: row and column offsets and flips, on the
    generator's device (packed training draws them per client and applies them to many clients at once)."""
    device = generator.device
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=device)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=device)
    return dy, dx, torch.rand(b, generator=generator, device=device) < 0.5


def crop_flip(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Crop each image of ``x`` (B, C, H, W) at its offsets after zero padding, mirrored where ``flip``."""
    b, c, h, w = x.shape
    dy, dx, flip = (to_device(t, x.device) for t in (dy, dx, flip))
    padded = F.pad(x, (padding, padding, padding, padding))
    rows = dy[:, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = dx[:, None] + torch.arange(w, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)  # reading columns backwards = mirror
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chan = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


def epoch_draws(n: int, generator: torch.Generator, batch: int,
                augment: bool) -> Iterator[tuple[torch.Tensor, CropFlipDraws | None]]:
    """One epoch of a client's random draws, in the order training makes them: the epoch's order of its ``n``
    samples, then per batch its sample indices and (``augment``) crop/flip draws. Lazy, so the draws of a batch
    come when it is asked for; sequential and packed training (fedsim.client.packed_trainer) both read these."""
    order = torch.randperm(n, generator=generator)
    for start in range(0, n, batch):
        idx = order[start:start + batch]
        yield idx, crop_flip_draws(len(idx), generator) if augment else None


def shuffled_batches(x: torch.Tensor, y: torch.Tensor, generator: torch.Generator, batch: int,
                     augment: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of a client's training batches, drawn by :func:`epoch_draws`."""
    for idx, draws in epoch_draws(len(y), generator, batch, augment):
        idx = to_device(idx, x.device)
        yield (x[idx] if draws is None else crop_flip(x[idx], *draws)), y[idx]
