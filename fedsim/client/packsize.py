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
from dataclasses import dataclass
from typing import Any

import torch

from fedsim.client.packed import TrainRequest

CANDIDATES = (2, 4, 8, 16, 32, 64, 128)
GAIN = 1.05  # a CPU: a larger pack must be this much faster per client-step
MAX_STEP_S = 2.0  # a CPU: a pack whose one step takes longer is not worth its latency on a worker
MEMORY_SHARE = 0.8  # a GPU: of the worker's share of the device's memory


@dataclass
class _Dummy:
    state: dict[str, torch.Tensor]


def _requests(rt: Any, size: int) -> list[TrainRequest]:
    full = rt.layouts["full"]
    batch = rt.cfg.train.batch_size
    x = torch.randn(batch, *rt.plan.input_shape, generator=torch.Generator().manual_seed(0)).to(rt.device)
    if rt.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.zeros(batch, dtype=torch.long, device=rt.device)
    return [TrainRequest(_Dummy({k: t.detach().clone() for k, t in zip(full.keys, full.targets)}), x, y,
                         frozenset({"body", "head"}), 1, torch.Generator().manual_seed(i), 1, None)
            for i in range(size)]


def _time_step(rt: Any, size: int) -> tuple[float, int]:
    """(seconds of one packed step of ``size`` clients, peak device bytes; 0 on a CPU)."""
    trained = [k for k in rt.layouts["full"].keys if k in rt.parameter_keys]
    hyper = {k: rt.sgd_settings(rt.part_of[k], 1) for k in trained}
    cuda = rt.device.type == "cuda"
    best = float("inf")
    for attempt in range(3):  # the first is a warm-up (allocations, kernel selection)
        requests = _requests(rt, size)
        if cuda:
            torch.cuda.synchronize(rt.device)
            torch.cuda.reset_peak_memory_stats(rt.device)
        start = time.perf_counter()
        rt.trainer.fit(requests, trained, hyper, rt.cfg.train.batch_size, False)
        if cuda:
            torch.cuda.synchronize(rt.device)
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best, torch.cuda.max_memory_allocated(rt.device) if cuda else 0


def choose_pack_size(rt: Any, gpu_fraction: float) -> int:
    """The pack size for runtime ``rt`` (a ClientRuntime with packed training on), printed once."""
    cuda = rt.device.type == "cuda"
    budget = torch.cuda.get_device_properties(rt.device).total_memory * (gpu_fraction or 1.0) * MEMORY_SHARE if cuda \
        else None
    chosen, best_rate, measured = CANDIDATES[0], 0.0, []
    for size in CANDIDATES:
        try:
            seconds, peak = _time_step(rt, size)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            break
        rate = size / seconds
        measured.append(f"{size}: {rate:.0f}/s" + (f", {peak / 2**20:.0f} MiB" if cuda else ""))
        if cuda:
            if peak > budget:
                break
            chosen = size
            continue
        if rate < best_rate * GAIN or seconds > MAX_STEP_S:
            break
        chosen, best_rate = size, rate
    print(f"engine.pack auto: {chosen} clients at once on {rt.device} (by pack size, client-steps per second"
          f"{' and peak memory' if cuda else ''}: {'; '.join(measured)})", flush=True)
    return chosen
