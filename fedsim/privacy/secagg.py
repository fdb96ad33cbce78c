"""Secure aggregation, simulated on the exact sums: Bonawitz et al. (CCS 2017) pairwise masking of the clients'
fixed-point uploads, so that the server learns the round's sum and nothing of any one client's upload.

For a round's cohort U (the clients sent the model, in client order) every pair i < j shares a seed s_ij; here it
is derived from (run seed, ``SECAGG_STREAM``, round, i, j), standing for the pair's Diffie-Hellman key agreement.
Client i uploads its int64 fixed-point vector x_i (``fedsim.core.aggregate``) plus

    m_i = sum_{j in U, j > i} PRG(s_ij) - sum_{j in U, j < i} PRG(s_ij)      (mod 2^64)

Over the whole cohort the masks cancel: sum_i m_i = 0 mod 2^64, so the masked uploads summed with wrap-around and
read as int64 are exactly sum_i x_i (which fits in int64 by the fixed-point design): results are bit for bit those
of the run without secure aggregation. Each masked upload alone is uniform on 2^64 words to anyone without the
seeds. The PRG is numpy's Philox, a counter-based generator keyed by the pair's seed, as the protocol's AES in
counter mode is.

A client of U that does not deliver (it diverged, left the fixed-point range, dropped out or reported late on the
virtual clock) leaves its pairs with every survivor uncancelled. In the protocol the server reconstructs the
dropped client's s_ij from the survivors' Shamir shares of its key and removes those masks; here
:meth:`PairwiseMasks.unmask` removes them from the per-pair seeds directly: the reconstruction is assumed, not run.
Not simulated either: key agreement and its signatures, Shamir sharing and its threshold t (a real round with
fewer than t survivors aborts; here it goes on), the self-masks b_i of double masking (which protect a survivor
whose upload arrives after the server declared it dropped), and a malicious server. docs/privacy.md says what
this means for what the server sees.

With DP, central noise is added by the server to the unmasked aggregate (it is trusted with the aggregate, never
with one client's update); local noise is each client's own, added before its upload is masked.

Cost: each client expands |U| - 1 pair seeds over the upload's length d, O(|U|^2 d) across the cohort per round;
the server's recovery expands one seed per (dropped, survivor) pair. Measured in BENCHMARKS.md
(``benchmarks/secagg.py``).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SECAGG_STREAM = 0x5EC4  # the pairs' seeds: a stream of their own beside the seed, never a client's training stream


@dataclass(frozen=True)
class PairwiseMasks:
    """One round's pairwise masks over its cohort: what the server fixes before the round and every worker uses to
    mask its clients' uploads. Uploads are masked in the order of their names, one stream per pair."""
    seed: int
    round: int
    cohort: tuple[int, ...]  # sorted: the clients sent the model this round

    def __post_init__(self) -> None:
        if list(self.cohort) != sorted(set(self.cohort)):
            raise ValueError(f"secure aggregation: the cohort must be distinct clients in order, got {self.cohort}")

    def pair_mask(self, low: int, high: int, size: int) -> np.ndarray:
        """PRG(s_ij) for the pair low < high: ``size`` uniform 64-bit words."""
        key = np.random.SeedSequence([self.seed, SECAGG_STREAM, self.round, low, high])
        return np.random.Generator(np.random.Philox(key)).integers(0, 2 ** 64, size=size, dtype=np.uint64)

    def mask(self, client: int, sizes: dict[str, int]) -> dict[str, np.ndarray]:
        """m_client per upload (uint64 words, ``sizes[name]`` of them): its pairs with every other member of the
        cohort over all its uploads, added where the other is larger, subtracted where smaller."""
        if client not in self.cohort:
            raise ValueError(f"secure aggregation: client {client} is not in round {self.round}'s cohort")
        words = np.zeros(sum(sizes.values()), np.uint64)
        for other in self.cohort:
            if other > client:
                words += self.pair_mask(client, other, words.size)
            elif other < client:
                words -= self.pair_mask(other, client, words.size)
        return _split(words, sizes)

    def unmask(self, totals: dict[str, np.ndarray], survivors: Iterable[int]) -> None:
        """Remove, in place from the round's int64 totals, the masks that survivors share with the clients of the
        cohort that did not deliver: afterwards ``totals`` hold exactly the survivors' unmasked sum. (The protocol
        reconstructs those pairs' seeds from the survivors' Shamir shares; this simulation reads them.)"""
        kept = sorted(set(survivors))
        if not set(kept) <= set(self.cohort):
            raise ValueError(f"secure aggregation: survivors {sorted(set(kept) - set(self.cohort))} are not in round "
                             f"{self.round}'s cohort")
        dropped = sorted(set(self.cohort) - set(kept))
        if not dropped or not kept:
            return  # every pair cancelled inside the sum, or nothing was summed
        size = sum(v.size for v in totals.values())
        residue = np.zeros(size, np.uint64)  # what the survivors' masks left: sum over (survivor, dropped) pairs
        for gone in dropped:
            for client in kept:
                if gone > client:
                    residue += self.pair_mask(client, gone, size)
                else:
                    residue -= self.pair_mask(gone, client, size)
        for name, part in _split(residue, {name: v.size for name, v in totals.items()}).items():
            words = totals[name].view(np.uint64)
            words -= part


def _split(words: np.ndarray, sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Words over all of a client's uploads cut into each upload's part, laid out by name (the same on every worker
    and the server, whatever order their dicts hold), returned in the order of ``sizes``."""
    names = sorted(sizes)
    parts = dict(zip(names, np.split(words, np.cumsum([sizes[name] for name in names])[:-1])))
    return {name: parts[name] for name in sizes}
