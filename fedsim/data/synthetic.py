"""Generated data sets: built in memory from their options, deterministic in the seed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedsim.data.array_dataset import ArrayDataset, content_digest
from fedsim.errors import DataError

_SYNTHETIC_OPTIONS = {"alpha": 0.5, "beta": 0.5, "num_clients": 30, "seed": 0}
# A client holds int(lognormal(4, 2)) + 50 samples of 60 float32 features, on average ~450 (108 kB): 10,000 clients
# are about 1 GB generated in the driver's memory, 300 times FedProx's 30; more would only exhaust it.
MAX_CLIENTS = 10_000


def synthetic(options: dict) -> ArrayDataset:
    """FedProx's Synthetic(alpha, beta) (Li et al. 2020, generate_synthetic.py in their repo).

    Per client k: u_k ~ N(0, alpha), B_k ~ N(0, beta) (standard deviations, as the repo's
    np.random.normal calls), W_k, b_k ~ N(u_k, 1), v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)),
    y = argmax(W_k x + b_k). alpha moves the models apart, beta the inputs. Sizes are the repo's
    int(lognormal(4, 2)) + 50, so every client keeps >= 40 train samples after the 80/20 split.
    """
    unknown = sorted(set(options) - set(_SYNTHETIC_OPTIONS))
    if unknown:
        raise DataError(f"data.options: unknown synthetic option(s) {unknown}; use {', '.join(_SYNTHETIC_OPTIONS)}")
    o = _SYNTHETIC_OPTIONS | options
    alpha, beta, n, seed = (_number(o, "alpha", float), _number(o, "beta", float), _number(o, "num_clients", int),
                            _number(o, "seed", int))
    for key, value in (("alpha", alpha), ("beta", beta)):
        if not (math.isfinite(value) and value >= 0):
            raise DataError(f"data.options.{key}: synthetic needs a finite number >= 0, got {value}")
    if seed < 0:
        raise DataError(f"data.options.seed: synthetic needs a seed >= 0, got {seed}")
    if not 1 <= n <= MAX_CLIENTS:
        raise DataError(f"data.options.num_clients: synthetic makes 1 to {MAX_CLIENTS:,} clients, got {n}")
    dim, num_classes = 60, 10
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, n).astype(np.int64) + 50
    u, b_mean = rng.normal(0, alpha, n), rng.normal(0, beta, n)
    sd = np.arange(1, dim + 1) ** -0.6  # sqrt of the covariance diagonal j^-1.2
    xs, ys = [], []
    for k, size in enumerate(sizes):
        w, b = rng.normal(u[k], 1, (dim, num_classes)), rng.normal(u[k], 1, num_classes)
        xs.append(rng.normal(b_mean[k], 1, dim) + sd * rng.standard_normal((size, dim)))
        ys.append(np.argmax(xs[-1] @ w + b, axis=1))
    features = np.concatenate(xs)
    if not np.abs(features).max() <= np.finfo(np.float32).max:
        raise DataError(f"data.options.beta: {beta:g} spreads the inputs past float32's range; give a smaller beta")
    x, y = features.astype(np.float32).reshape(-1, 1, 1, dim), np.concatenate(ys).astype(np.int64)
    groups = np.repeat(np.arange(n, dtype=np.int64), sizes)
    train = np.concatenate([np.arange(size) < int(0.8 * size) for size in sizes])  # each client's first 80%
    classes = tuple(str(c) for c in range(num_classes))
    arrays = (x[train], y[train], x[~train], y[~train])
    return ArrayDataset("synthetic", *arrays, classes,
                        (0.0,) * dim, (1.0,) * dim,  # features stay as generated: to_float is the identity
                        groups[train], groups[~train], augmentable=False,
                        digest=content_digest(*arrays, groups[train], groups[~train]))


def _number(options: dict, key: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(options[key])
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        raise DataError(f"data.options.{key}: synthetic needs a {'whole ' if kind is int else ''}number, got "
                        f"{options[key]!r}") from None
