"""What every partition kind receives: the labels, the arguments and the one random generator, with the kept
sample pools every kind draws first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsim.data.partition import Partition


@dataclass(frozen=True, eq=False)
class Request:
    """Everything a partition kind may use; each kind checks the arguments it needs."""

    train_y: np.ndarray
    test_y: np.ndarray
    num_clients: int
    rng: np.random.Generator
    train_fraction: float
    test_fraction: float
    k: int | None
    shards_per_client: int | None
    shard_style: str
    beta: float | None
    groups: tuple[np.ndarray, np.ndarray] | None
    agreed: float = 0.0

    def pools(self, strata: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The kept train and test indices: the configured fraction of every stratum (default: class).

        Every kind calls this before drawing anything else, so the subset does not depend on the kind.
        """
        train_strata, test_strata = strata or (self.train_y, self.test_y)
        return (_stratified_subset(train_strata, self.train_fraction, self.rng),
                _stratified_subset(test_strata, self.test_fraction, self.rng))


Splitter = Callable[[Request], Partition]


def _stratified_subset(strata: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a random ``fraction`` of each stratum (at least one), so small runs stay balanced."""
    kept = []
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        kept.append(rng.permutation(members)[: max(1, round(fraction * len(members)))])
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, np.int64)
