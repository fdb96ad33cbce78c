"""Summaries of per-client metrics across clients: the one place the fairness statistics are defined."""
from __future__ import annotations

import numpy as np


def summarize(values: list[float]) -> dict[str, float]:
    """Mean, population std, min, max, p10, mean of the worst 10% of clients and Jain's fairness index.

    p10 uses numpy's linear interpolation. worst10_mean averages the ceil(10%) lowest values (at least one),
    so small federations still report their worst client. Jain's index (sum x)^2 / (n * sum x^2) is 1 for
    equal values and 1/n when one client has everything; all-zero values count as equal (1.0).
    """
    arr = np.sort(np.asarray(values, dtype=np.float64))
    if arr.size == 0:
        raise ValueError("summarize needs at least one client value")
    worst = -(-arr.size // 10)  # integer ceil: 0.1 * n in floats can land just above an integer (0.1 * 30)
    squares = float(np.sum(arr**2))
    jain = float(arr.sum() ** 2 / (arr.size * squares)) if squares > 0 else 1.0
    return {"mean": float(arr.mean()), "std": float(arr.std()), "min": float(arr[0]), "max": float(arr[-1]),
            "p10": float(np.percentile(arr, 10)), "worst10_mean": float(arr[:worst].mean()), "jain": jain}
