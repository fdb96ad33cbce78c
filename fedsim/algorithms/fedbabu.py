from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing

if TYPE_CHECKING:
    from torch import nn

    from fedsim.core.layout import KeyParts


class FedBABUParams(Params):
    head_init: Literal["orthogonal", "orthogonal_scaled", "linear", "not_orthogonal"] = Field(
        "orthogonal", description="fixed head: orthonormal rows (paper, App. Q), orthogonal rows scaled to the "
        "expected row norm of nn.Linear's default init, sqrt(in_features / (3 fan_in)) = 0.577, so that FedAvg "
        "and FedBABU start at one logit scale, nn.Linear's default init (the authors' main_fed.py), or nearly "
        "parallel rows (App. Q's ablation); bias 0 except for linear; drawn once from the seed, identical on "
        "every client")


class FedBABU(PartialSharing):
    """body trained and averaged under a fixed random head; head tuned at evaluation (Oh et al. 2021)"""
    name, train, share = "fedbabu", "body", "body"
    reports = "acc_personalized"  # the head is tuned at evaluation: the paper's accuracy is the fine-tuned one
    Params = FedBABUParams
    params: FedBABUParams

    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        if self.params.head_init == "linear":  # the module's own initialisation stays
            return
        from fedsim.models.state import output_layer

        draw = {"orthogonal": orthogonal_head, "orthogonal_scaled": orthogonal_head_at_default_norm,
                "not_orthogonal": nearly_parallel_head}[self.params.head_init]
        draw(output_layer(net, keys.head))


def orthogonal_head(layer: nn.Linear) -> None:
    """Orthonormal classifier rows give every class an equally separated target (FedBABU, App. Q)."""
    import torch
    from torch import nn

    with torch.no_grad():
        nn.init.orthogonal_(layer.weight)
        if layer.bias is not None:
            layer.bias.zero_()


def default_row_norm(layer: nn.Linear) -> float:
    """The expected row norm of nn.Linear's default weight init: kaiming_uniform_(a=sqrt(5)) draws each entry from
    U(-b, b) with b = gain sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), so b = 1 / sqrt(fan_in) and an
    entry's variance is b^2 / 3; a row of ``in_features`` entries has E||w||^2 = in_features / (3 fan_in), i.e.
    1/3 (fan_in = in_features): row norm ~0.577 whatever the width (torch.nn.Linear.reset_parameters; the
    FedBABU authors' models/Nets.py leaves `linear` at this init for FedAvg and FedBABU alike)."""
    import math

    from torch import nn

    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(layer.weight)
    bound = 1 / math.sqrt(fan_in)
    return math.sqrt(layer.weight.shape[1] * bound ** 2 / 3)


def orthogonal_head_at_default_norm(layer: nn.Linear) -> None:
    """Orthogonal rows (App. Q) at the scale of nn.Linear's default init (``default_row_norm``), bias 0: FedBABU's
    fixed head then gives logits of the size FedAvg's default-initialised head gives, rather than 1.7x larger with
    unit rows (``orthogonal``)."""
    import torch
    from torch import nn

    with torch.no_grad():
        nn.init.orthogonal_(layer.weight, gain=default_row_norm(layer))
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
