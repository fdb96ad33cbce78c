"""Summaries of per-client metrics across clients: the one place the fairness statistics are defined."""
from __future__ import annotations

import numpy as np


def summarize(values: list[float], lower_is_better: bool = False) -> dict[str, float]:
    """Mean, population std, min, max, p10, mean of the worst 10% of clients and Jain's fairness index.

    p10 is the boundary of the worst 10% of clients and worst10_mean their mean, in the metric's direction
    (``lower_is_better``: a loss, whose worst clients are its highest values, so p10 is then the 90th percentile).
    p10 uses numpy's linear interpolation. worst10_mean averages the ceil(10%) worst values (at least one),
    so small federations still report their worst client. Jain's index (sum x)^2 / (n * sum x^2) = 1 / (1 + CV^2)
    measures equality whatever the direction: 1 for equal values, 1/n when one client has everything (all of
    the accuracy, or all of the loss); all-zero values count as equal (1.0). min and max are the values' own.
    """
    arr = np.sort(np.asarray(values, dtype=np.float64))
    if arr.size == 0:
        raise ValueError("summarize needs at least one client value")
    worst = -(-arr.size // 10)  # integer ceil: 0.1 * n in floats can land just above an integer (0.1 * 30)
    squares = float(np.sum(arr**2))
    jain = float(arr.sum() ** 2 / (arr.size * squares)) if squares > 0 else 1.0
    worst_first = arr[::-1] if lower_is_better else arr
    return {"mean": float(arr.mean()), "std": float(arr.std()), "min": float(arr[0]), "max": float(arr[-1]),
            "p10": float(np.percentile(arr, 90 if lower_is_better else 10)),
            "worst10_mean": float(worst_first[:worst].mean()), "jain": jain}


def times_to_accuracy(system: dict) -> list[tuple[str, float, float | None]]:
    """(accuracy, target in 0-1, the simulated seconds at which the clients' mean first reached it, or None: never)
    for each system.target_accuracy, from summary.json's ``system`` block (empty without system.devices)."""
    return [(key, float(target), seconds) for key, times in system.get("time_to_accuracy", {}).items()
            for target, seconds in times.items()]
