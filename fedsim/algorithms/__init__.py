"""Algorithm registry. Adding an algorithm = one short file declaring an :class:`Algorithm`."""
from __future__ import annotations

from fedsim.algorithms.ditto import DITTO
from fedsim.algorithms.fedavg import FEDAVG
from fedsim.algorithms.fedbabu import FEDBABU
from fedsim.algorithms.fedper import FEDPER
from fedsim.algorithms.fedper_ft import FEDPER_FT
from fedsim.algorithms.fedprox import FEDPROX, FEDPROX_BABU
from fedsim.algorithms.fedrep import FEDREP
from fedsim.algorithms.lg_fedavg import LG_FEDAVG
from fedsim.algorithms.local import LOCAL
from fedsim.algorithms.spec import PARTS, Algorithm

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a for a in (FEDAVG, FEDPER, LOCAL, FEDBABU, FEDREP, FEDPER_FT, LG_FEDAVG, FEDPROX, FEDPROX_BABU, DITTO)
}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "PARTS", "Algorithm", "get_algorithm"]
