"""Aggregation of client uploads.

Workers sum their own clients' weighted uploads and send one partial per round; the server adds the W
partials. Float sums are not associative, so a float partial would make results depend on how clients
were grouped into workers. The sums are therefore exact: fixed point in int64.

Per upload and per tensor t of the shared layout, the server fixes a power-of-two quantum 2^L_t before
the round, from a reference (its own current value of that upload: the global weights, say) and the
round's total weight S = sum w_j (w_j = n_j, or 1 under uniform weighting):

    e_t = ceil(log2 max|ref_t|)   (0 when ref_t is all zero)
    L_t = e_t + HEADROOM_BITS + ceil(log2 S) - 62

A client contributes q_j = round(w_j * W_j / 2^L_t) as int64. w_j * W_j is exact in float64 (a float32
has 24 significant bits, w_j < 2^29), and dividing by a power of two is exact, so q_j is a pure function
of the client. Integer addition is associative: any number of workers, any completion order, any
reduction tree gives the same sum. A value with |W_j| > 2^(e_t + HEADROOM_BITS) is out of range and its
client is treated as diverged (deterministically, per client); within range the total stays below 2^62,
so it cannot overflow. The mean is sum_q * 2^L_t / S in float64.

Error bound: each q_j is off by at most half a quantum, so the mean is off by at most 2^(L_t - 1), i.e.
by at most 2^(ceil(log2 S) + HEADROOM_BITS - 62) = 2^(ceil(log2 S) - 46) of the tensor's reference
magnitude 2^e_t: 2^-33 of it at S = 8,192 samples, 2^-26 at S = 10^6 - below float32's resolution
(2^-24) either way.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fedsim.core.pages import release_shared

HEADROOM_BITS = 16  # a client's value may exceed the reference's largest by 2^16 before it is out of range
_TOTAL_BITS = 62  # sums stay below 2^62 < 2^63


@dataclass(frozen=True)
class FixedPoint:
    """One upload's exact-sum scale for one round, per tensor (a few hundred ints travel to the workers,
    not a vector the size of the model)."""
    exponent: np.ndarray  # int per tensor: e_t
    quantum_exponent: np.ndarray  # int per tensor: L_t
    offsets: tuple[int, ...]  # tensor boundaries in the flat vector

    @classmethod
    def plan(cls, reference: np.ndarray, offsets: tuple[int, ...], total_weight: int) -> FixedPoint:
        magnitude = np.array([np.abs(reference[a:b]).max(initial=0.0) for a, b in zip(offsets, offsets[1:])])
        exponent = np.zeros(len(magnitude), np.int64)
        nonzero = magnitude > 0
        exponent[nonzero] = np.ceil(np.log2(magnitude[nonzero]))
        quantum = exponent + HEADROOM_BITS + math.ceil(math.log2(max(total_weight, 1))) - _TOTAL_BITS
        return cls(exponent, quantum, tuple(offsets))

    def scales(self) -> tuple[np.ndarray, np.ndarray]:
        """Per value: the quantum 2^L_t and the range limit 2^(e_t + HEADROOM_BITS) of its tensor."""
        sizes = np.diff(self.offsets)
        return (np.repeat(np.ldexp(1.0, self.quantum_exponent), sizes),
                np.repeat(np.ldexp(1.0, self.exponent + HEADROOM_BITS), sizes))

    def limit_in_quanta(self) -> float:
        """The range limit in units of a tensor's quantum, 2^(e_t + HEADROOM_BITS - L_t) = 2^(62 - ceil(log2 S)):
        the same for every tensor, so a scaled vector is checked against one number."""
        return float(np.ldexp(1.0, int(np.max(self.exponent + HEADROOM_BITS - self.quantum_exponent, initial=0))))

    def mean(self, total: np.ndarray, total_weight: int, tensor: int) -> np.ndarray:
        """Tensor ``tensor`` of total * 2^L_t / S, in float64: the server turns a round's sums into means one
        tensor at a time and never holds a float64 copy of the whole model (its peak memory)."""
        start, end = self.offsets[tensor], self.offsets[tensor + 1]
        out = total[start:end].astype(np.float64)
        out *= np.ldexp(1.0, int(self.quantum_exponent[tensor]))
        out /= total_weight
        return out


class RoundSums:
    """A round's exact totals at the server, per upload: each worker's partial sums are added as soon as they
    arrive and can then be dropped, so the server never holds W partials (integer addition: the same totals
    for any number of workers and any order of arrival)."""

    CHUNK = 1 << 22  # values added, then released, at a time (32 MB of int64)

    def __init__(self, uploads: Iterable[str], size: int):
        self.totals = {name: np.zeros(size, np.int64) for name in uploads}
        self.weights = dict.fromkeys(self.totals, 0)

    def add(self, sums: dict[str, np.ndarray], weights: dict[str, int]) -> None:
        """Add one partial; pages of it that came through Ray's object store are released as they are added."""
        for name, total in self.totals.items():
            for start in range(0, total.size, self.CHUNK):
                part = sums[name][start:start + self.CHUNK]
                total[start:start + self.CHUNK] += part
                release_shared(part)
            self.weights[name] += weights[name]


class ReferenceExactSum:
    """A running sum of weighted uploads for one round, in int64 quanta: the reference in numpy, which the tests and
    benchmarks check against. Workers sum with ``fedsim.client.resident.ExactSum``, the same arithmetic on their
    device, equal bit for bit (tested), whose guard is the one that keeps personal weights off the server."""

    def __init__(self, scale: FixedPoint):
        self.quantum, self.limit = scale.scales()
        self.total = np.zeros(len(self.quantum), np.int64)

    def fits(self, vector: np.ndarray) -> bool:
        """Whether every value is within range (NaN and infinities are not)."""
        if vector.shape != self.total.shape:  # the guard: only the shared layout may reach the server
            raise RuntimeError(f"an upload of {vector.size} values where the shared part has {self.total.size} - "
                               "refusing a payload that could hold personal weights")
        return bool(np.all(np.abs(vector) <= self.limit))

    def add(self, weight: int, vector: np.ndarray) -> None:
        self.total += np.rint(weight * vector.astype(np.float64) / self.quantum).astype(np.int64)


def weighted_average(updates: list[tuple[int, int, np.ndarray]], as_float32: bool = True) -> np.ndarray:
    """The float64 reference: sum_j gamma_j W_j with gamma_j = n_j / sum n, summed in client-id order.

    Exact only up to float64 rounding and dependent on the summation order, so the engine uses the
    fixed-point sums above; this is what they are checked against. ``as_float32=False`` returns float64.
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
