"""Settings a worker applies to its GPU so that runs stay reproducible there too."""
from __future__ import annotations

import os

import torch

# cuBLAS reads it when its first handle is made: a fixed workspace makes its reductions run in one order.
CUBLAS_WORKSPACE = ":4096:8"


def make_cuda_deterministic() -> None:
    """Same config + seed => same per-client metrics on a GPU as well: cuDNN's autotuner and some cuBLAS and
    cuDNN kernels (split reductions, atomics) otherwise vary between runs and processes. Called before the
    worker's first CUDA work. An op with no deterministic CUDA kernel only warns (warn_only): the run goes on,
    and benchmarks/gpu_check.py compares the metrics to show whether it mattered."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new CUDA tensor with NaN (a debugging aid for code that reads memory
    # it never wrote); no result depends on that, and on an H200 it was ~1,000 fill kernels per client of
    # ResNet-34, most of the per-client fixed cost (BENCHMARKS.md, "Per-client fixed cost on one GPU").
    # A property of torch.utils.deterministic's module class (torch swaps the class in), which a checker cannot see.
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
