from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing

if TYPE_CHECKING:
    from torch import nn


class FedBABUParams(Params):
    head_init: Literal["orthogonal", "linear", "not_orthogonal"] = Field(
        "orthogonal", description="fixed head: orthonormal rows (paper, App. Q), nn.Linear's default init "
        "(the authors' main_fed.py), or nearly parallel rows (App. Q's ablation); drawn once from the seed, "
        "identical on every client")


class FedBABU(PartialSharing):
    """body trained and averaged under a fixed random head; head tuned at evaluation (Oh et al. 2021)"""
    name, train, share = "fedbabu", "body", "body"
    Params = FedBABUParams

    def init_model(self, net: nn.Module) -> None:
        if self.params.head_init == "orthogonal":
            orthogonal_head(net)
        elif self.params.head_init == "not_orthogonal":
            nearly_parallel_head(net)


def orthogonal_head(net: nn.Module) -> None:
    """Orthonormal classifier rows give every class an equally separated target (FedBABU, App. Q)."""
    import torch
    from torch import nn

    with torch.no_grad():
        nn.init.orthogonal_(net.output_layer.weight)
        if net.output_layer.bias is not None:
            net.output_layer.bias.zero_()


def nearly_parallel_head(net: nn.Module) -> None:
    """App. Q's non-orthogonal head, as the authors' main_single.py draws it: entries from U(0.45, 0.55), each
    row scaled to unit norm, so every pair of class directions is almost the same (cosine near 1)."""
    import torch
    from torch import nn

    with torch.no_grad():
        weight = net.output_layer.weight
        nn.init.uniform_(weight, 0.45, 0.55)
        weight.div_(weight.norm(dim=1, keepdim=True))
        if net.output_layer.bias is not None:
            net.output_layer.bias.zero_()
