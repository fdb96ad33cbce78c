"""Server-side aggregation of shared weights."""
from __future__ import annotations

import numpy as np


def weighted_average(updates: list[tuple[int, int, np.ndarray]], as_float32: bool = True) -> np.ndarray:
    """FedPer/FedAvg aggregation: sum_j gamma_j W_j with gamma_j = n_j / sum n over the participants.

    ``updates`` holds (client id, n_j, W_j). Clients are summed in id order, in float64, so the result
    does not depend on which worker finished first or how many workers there were. ``as_float32=False``
    returns the float64 sum, for server hooks that compute on it.
    """
    if not updates:
        raise ValueError("weighted_average needs at least one client update")
    total = sum(n for _, n, _ in updates)
    if total <= 0:
        raise ValueError("weighted_average: participating clients hold no training samples")
    acc = np.zeros(updates[0][2].shape, dtype=np.float64)
    for _, n, vector in sorted(updates, key=lambda u: u[0]):
        acc += (n / total) * vector
    return acc.astype(np.float32) if as_float32 else acc
