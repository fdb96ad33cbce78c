"""Summaries of per-client metrics across clients."""
from __future__ import annotations

import numpy as np


def summarize(values: list[float]) -> dict[str, float]:
    """Mean, std (population), min and max across clients."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("summarize needs at least one client value")
    return {"mean": float(arr.mean()), "std": float(arr.std()), "min": float(arr.min()), "max": float(arr.max())}
