"""An algorithm is a declaration of *what trains locally* and *what the server averages*.

Parts name pieces of a :class:`~fedsim.models.SplitNet` split at ``model.personal_layers``:
``body`` (the base), ``head`` (the personal layers), ``full`` (both), ``none``.
The few methods that need more than that set one of the flags below; the engine reads only
these fields and never branches on an algorithm's name.
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
    head_first: bool = False  # train the head alone for train.head_epochs on the new body first (FedRep, FedPer-FT)
    orthogonal_head: bool = False  # classifier rows start orthonormal, identical on every client (FedBABU)
    proximal: bool = False  # + mu/2 ||w - w_global||^2 over shared parameters, mu = train.mu (FedProx)
    personal_model: bool = False  # a separate full personal model pulled toward the global one by
    #                               train.ditto_lambda; clients are scored with it (Ditto)
    summary: str = ""

    @property
    def trained_parts(self) -> frozenset[str]:
        return PARTS[self.train]

    @property
    def shared_parts(self) -> frozenset[str]:
        return PARTS[self.share]

    @property
    def keeps_client_state(self) -> bool:
        """Whether anything of a client's model outlives a round on its worker. If not (FedAvg, FedProx),
        any worker can train any client, so each round's sample can be balanced over the workers afresh."""
        return self.shared_parts != PARTS["full"] or self.personal_model
