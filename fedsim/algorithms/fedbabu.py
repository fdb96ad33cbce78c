from typing import Literal

from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing


class FedBABUParams(Params):
    head_init: Literal["orthogonal", "linear"] = Field(
        "orthogonal", description="fixed head: orthonormal rows (paper, App. Q) or nn.Linear's default init "
        "(the authors' main_fed.py); drawn once from the seed, identical on every client")


class FedBABU(PartialSharing):
    """body trained and averaged under a fixed random head; head tuned at evaluation (Oh et al. 2021)"""
    name, train, share = "fedbabu", "body", "body"
    Params = FedBABUParams

    def init_model(self, net) -> None:
        if self.params.head_init == "orthogonal":
            orthogonal_head(net)


def orthogonal_head(net) -> None:
    """Orthonormal classifier rows give every class an equally separated target (FedBABU, App. Q)."""
    import torch
    from torch import nn

    with torch.no_grad():
        nn.init.orthogonal_(net.output_layer.weight)
        if net.output_layer.bias is not None:
            net.output_layer.bias.zero_()
