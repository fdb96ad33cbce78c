"""The Gaussian noise of user-level DP, each draw from a stream of its own derived from the run's seed: never a
client's training generator (turning DP on shifts no training randomness) and never the worker (a noisy run is
the same bit for bit for any number of workers, any pack size and after a resume).

- central: the server's noise on the round's sum, per tensor of the shared layout, from (seed, CENTRAL, round, tensor):
  a tensor's noise does not depend on how the server groups tensors, and it never holds a float64 model of noise;
- local: a client's own noise on its update, from (seed, LOCAL, round, client);
- the adaptive clip norm's noisy count, from (seed, COUNT, round).
"""
from __future__ import annotations

import numpy as np

# Stream ids, apart from every other stream of the run (fedsim.client.randomness, fedsim.plan: small ints and 0x...).
CENTRAL_STREAM = 0xD9C0
LOCAL_STREAM = 0xD910
COUNT_STREAM = 0xD9C7


def gaussian(key: tuple[int, ...], size: int, std: float) -> np.ndarray:
    """``size`` draws of N(0, std^2) in float64 from the stream ``key`` (seed, stream id, round, ...)."""
    rng = np.random.default_rng(np.random.SeedSequence(list(key)))
    return rng.standard_normal(size) * std


def central_noise(seed: int, round_idx: int, tensor: int, size: int, std: float) -> np.ndarray:
    """The server's noise on tensor ``tensor`` of the round's sum of clipped updates (DP-FedAvg)."""
    return gaussian((seed, CENTRAL_STREAM, round_idx, tensor), size, std)


def local_noise(seed: int, round_idx: int, client: int, size: int, std: float) -> np.ndarray:
    """Client ``client``'s own noise on its clipped update in ``round_idx`` (local DP)."""
    return gaussian((seed, LOCAL_STREAM, round_idx, client), size, std)


def count_noise(seed: int, round_idx: int, std: float) -> float:
    """The noise on the count of clients whose update was within the clip norm (adaptive clipping)."""
    return float(gaussian((seed, COUNT_STREAM, round_idx), 1, std)[0])
