"""Algorithm registry. Adding an algorithm = one short file declaring an :class:`Algorithm`."""
from __future__ import annotations

from fedsim.algorithms.fedavg import FEDAVG
from fedsim.algorithms.fedper import FEDPER
from fedsim.algorithms.local import LOCAL
from fedsim.algorithms.spec import PARTS, Algorithm

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (FEDAVG, FEDPER, LOCAL)}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "PARTS", "Algorithm", "get_algorithm"]
