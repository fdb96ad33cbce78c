from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing

if TYPE_CHECKING:
    from torch import nn

    from fedsim.core.layout import KeyParts


class FedBABUParams(Params):
    head_init: Literal["orthogonal", "linear", "not_orthogonal"] = Field(
        "orthogonal", description="fixed head: orthonormal rows (paper, App. Q), nn.Linear's default init "
        "(the authors' main_fed.py), or nearly parallel rows (App. Q's ablation); drawn once from the seed, "
        "identical on every client")


class FedBABU(PartialSharing):
    """body trained and averaged under a fixed random head; head tuned at evaluation (Oh et al. 2021)"""
    name, train, share = "fedbabu", "body", "body"
    Params = FedBABUParams

    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        if self.params.head_init == "linear":  # the module's own initialisation stays
            return
        from fedsim.models.state import output_layer

        draw = orthogonal_head if self.params.head_init == "orthogonal" else nearly_parallel_head
        draw(output_layer(net, keys.head))


def orthogonal_head(layer: nn.Linear) -> None:
    """Orthonormal classifier rows give every class an equally separated target (FedBABU, App. Q)."""
    import torch
    from torch import nn

    with torch.no_grad():
        nn.init.orthogonal_(layer.weight)
        if layer.bias is not None:
            layer.bias.zero_()


def nearly_parallel_head(layer: nn.Linear) -> None:
    """App. Q's non-orthogonal head, as the authors' main_single.py draws it: entries from U(0.45, 0.55), each
    row scaled to unit norm, so every pair of class directions is almost the same (cosine near 1)."""
    import torch
    from torch import nn

    with torch.no_grad():
        nn.init.uniform_(layer.weight, 0.45, 0.55)
        layer.weight.div_(layer.weight.norm(dim=1, keepdim=True))
        if layer.bias is not None:
            layer.bias.zero_()
