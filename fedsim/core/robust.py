"""Robust aggregation rules (``server.aggregator``): what a server that sees every reply puts in place of the
weighted mean, for any method of the FedAvg family (its server hook then gets these values as its "means").

Each rule weighs clients equally, as its paper does (Yin et al. 2018, coordinate-wise median and trimmed mean;
Blanchard et al. 2017, Krum and Multi-Krum). Replies arrive in client order; every rule is a fixed sequence of
numpy operations on them, so the result is the same for any number of workers and any completion order. Work is
done a chunk of coordinates at a time, so float64 working memory stays at (clients x CHUNK) values, not a second
copy of every reply; a chunk is laid out one coordinate per row, so the per-coordinate sorts and partitions run
over contiguous memory (measured 2x faster for the median, 4x for the trimmed mean, than one client per row).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

CHUNK = 1 << 14  # coordinates per step: 100 replies x 2^14 x 8 bytes = 13 MB of float64


def _chunks(size: int) -> Iterator[slice]:
    for start in range(0, size, CHUNK):
        yield slice(start, min(start + CHUNK, size))


def _by_coordinate(vectors: Sequence[np.ndarray], part: slice) -> np.ndarray:
    """(coordinates, clients) in float64: one row per coordinate of the chunk."""
    return np.stack([v[part] for v in vectors], axis=1).astype(np.float64)


def coordinate_median(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Per coordinate, the median over clients (the mean of the middle two for an even count)."""
    out = np.empty(vectors[0].size, np.float64)
    for part in _chunks(out.size):
        out[part] = np.median(_by_coordinate(vectors, part), axis=1)
    return out


def trimmed_mean(vectors: Sequence[np.ndarray], fraction: float) -> np.ndarray:
    """Per coordinate, the mean after dropping the floor(fraction x n) largest and as many smallest values."""
    n = len(vectors)
    cut = int(np.floor(fraction * n))
    out = np.empty(vectors[0].size, np.float64)
    for part in _chunks(out.size):
        ordered = np.sort(_by_coordinate(vectors, part), axis=1)
        out[part] = ordered[:, cut:n - cut].mean(axis=1)
    return out


def krum_scores(vectors: Sequence[np.ndarray], byzantine: int) -> np.ndarray:
    """Krum's score of each reply: the sum of its squared distances to its n - f - 2 nearest other replies."""
    n = len(vectors)
    squared = np.zeros((n, n), np.float64)
    for part in _chunks(vectors[0].size):
        block = np.stack([v[part] for v in vectors]).astype(np.float64)  # (clients, coordinates): one Gram product
        norms = np.einsum("ij,ij->i", block, block)
        squared += norms[:, None] + norms[None, :] - 2 * block @ block.T
    np.fill_diagonal(squared, np.inf)
    nearest = np.sort(np.maximum(squared, 0), axis=1)[:, :n - byzantine - 2]
    scores: np.ndarray = nearest.sum(axis=1)
    return scores


def krum_selection(vectors: Sequence[np.ndarray], byzantine: int, select: int) -> list[int]:
    """Indices of the ``select`` replies with the lowest Krum scores (ties: the earlier client), in order."""
    scores = krum_scores(vectors, byzantine)
    return sorted(np.argsort(scores, kind="stable")[:select].tolist())


def mean_of(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """The unweighted mean, summed in order (Multi-Krum's average of the selected replies)."""
    out = np.zeros(vectors[0].size, np.float64)
    for v in vectors:
        out += v
    return out / len(vectors)


def fewest_replies(rule: str, byzantine: int) -> int:
    """The fewest replies a rule is defined for: Krum needs n > 2f + 2 (Blanchard et al. 2017, Prop. 1)."""
    return 2 * byzantine + 3 if rule == "krum" else 1


def robust_means(rule: str, trim_fraction: float, byzantine: int, select: int,
                 uploads: Mapping[str, Sequence[np.ndarray]], by: str) -> dict[str, np.ndarray]:
    """Per upload, the rule's location estimate (float64) of the replies ``uploads[name]`` (in client order).
    Krum chooses clients by their ``by`` upload (the weights) and averages every upload over the chosen."""
    if rule == "median":
        return {name: coordinate_median(vs) for name, vs in uploads.items()}
    if rule == "trimmed_mean":
        return {name: trimmed_mean(vs, trim_fraction) for name, vs in uploads.items()}
    if rule == "krum":
        chosen = krum_selection(uploads[by], byzantine, select)
        return {name: mean_of([vs[i] for i in chosen]) for name, vs in uploads.items()}
    raise ValueError(f"server.aggregator: unknown rule {rule!r}")
