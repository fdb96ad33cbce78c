"""engine.pack: auto -- how many clients a worker trains at once, measured on the worker's own device.

Each candidate size from 2, doubling, times one packed SGD step of dummy clients (the run's model, batch size and
input shape). On a CPU the search keeps the fastest per client-step, stopping at the first size that is not 5%
faster than the best so far or whose step alone takes longer than MAX_STEP_S. On a GPU it keeps the largest size
whose peak memory fits the worker's share (MEMORY_SHARE of the device's memory times engine.gpus_per_worker): a
choice from memory alone, the same on every run of one config on one kind of GPU, since on a GPU the claim that any
pack size computes the same is not yet checked (benchmarks/gpu_check.sh --parts packed). On a CPU any pack size >= 2
computes the same (tested), so there the choice changes speed only.
"""
from __future__ import annotations

import time

import torch

from fedsim.client.packed_trainer import PackedTrainer, TrainRequest
from fedsim.client.setup import WorkerModel

CANDIDATES = (2, 4, 8, 16, 32, 64, 128)
GAIN = 1.05  # a CPU: a larger pack must be this much faster per client-step
MAX_STEP_S = 2.0  # a CPU: a pack whose one step takes longer is not worth its latency on a worker
MEMORY_SHARE = 0.8  # a GPU: of the worker's share of the device's memory


def _requests(model: WorkerModel, input_shape: tuple[int, ...], batch: int, size: int) -> list[TrainRequest]:
    full = model.layouts["full"]
    x = torch.randn(batch, *input_shape, generator=torch.Generator().manual_seed(0)).to(model.device)
    if model.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.zeros(batch, dtype=torch.long, device=model.device)
    return [TrainRequest({k: t.detach().clone() for k, t in zip(full.keys, full.targets)}, x, y,
                         frozenset({"body", "head"}), 1, torch.Generator().manual_seed(i), 1, None)
            for i in range(size)]


def _time_step(trainer: PackedTrainer, model: WorkerModel, input_shape: tuple[int, ...], batch: int,
               size: int) -> tuple[float, int]:
    """(seconds of one packed step of ``size`` clients, peak device bytes; 0 on a CPU)."""
    trained = model.trainable(frozenset({"body", "head"}))
    hyper = {k: model.settings.sgd(model.part_of[k], 1) for k in trained}
    cuda = model.device.type == "cuda"
    best = float("inf")
    for attempt in range(3):  # the first is a warm-up (allocations, kernel selection)
        requests = _requests(model, input_shape, batch, size)
        if cuda:
            torch.cuda.synchronize(model.device)
            torch.cuda.reset_peak_memory_stats(model.device)
        start = time.perf_counter()
        trainer.fit(requests, trained, hyper, batch, False)
        if cuda:
            torch.cuda.synchronize(model.device)
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best, torch.cuda.max_memory_allocated(model.device) if cuda else 0


def choose_pack_size(trainer: PackedTrainer, model: WorkerModel, input_shape: tuple[int, ...], batch: int,
                     gpu_fraction: float) -> int:
    """The pack size for ``trainer`` of a worker's ``model`` (the run's input shape and batch size), printed once."""
    device = model.device
    cuda = device.type == "cuda"
    budget = torch.cuda.get_device_properties(device).total_memory * (gpu_fraction or 1.0) * MEMORY_SHARE if cuda \
        else None
    chosen, best_rate, measured = CANDIDATES[0], 0.0, []
    for size in CANDIDATES:
        try:
            seconds, peak = _time_step(trainer, model, input_shape, batch, size)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            break
        rate = size / seconds
        measured.append(f"{size}: {rate:.0f}/s" + (f", {peak / 2**20:.0f} MiB" if cuda else ""))
        if budget is not None:  # on a GPU
            if peak > budget:
                break
            chosen = size
            continue
        if rate < best_rate * GAIN or seconds > MAX_STEP_S:
            break
        chosen, best_rate = size, rate
    print(f"engine.pack auto: {chosen} clients at once on {device} (by pack size, client-steps per second"
          f"{' and peak memory' if cuda else ''}: {'; '.join(measured)})", flush=True)
    return chosen
