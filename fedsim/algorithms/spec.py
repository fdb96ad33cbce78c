"""An algorithm is a declaration of *what trains locally* and *what the server averages*.

Parts name pieces of a :class:`~fedsim.models.SplitNet` split at ``model.personal_layers``:
``body`` (the base), ``head`` (the personal layers), ``full`` (both), ``none``.
The engine reads only these fields; it never branches on an algorithm's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Part = Literal["full", "body", "head", "none"]

PARTS: dict[str, frozenset[str]] = {
    "full": frozenset({"body", "head"}),
    "body": frozenset({"body"}),
    "head": frozenset({"head"}),
    "none": frozenset(),
}


@dataclass(frozen=True)
class Algorithm:
    name: str
    train: Part  # what the client's local SGD updates
    share: Part  # what is sent to, averaged by and broadcast from the server
    summary: str = ""

    @property
    def trained_parts(self) -> frozenset[str]:
        return PARTS[self.train]

    @property
    def shared_parts(self) -> frozenset[str]:
        return PARTS[self.share]
