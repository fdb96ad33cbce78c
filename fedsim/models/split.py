"""A network as an ordered list of blocks plus a classifier.

Personalization depth is structural: ``personal_layers = K_P`` makes the classifier and the
last ``K_P - 1`` blocks the *head* (personal); everything before is the *base* (shared).
K_P = 0 means nothing is personal.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class SplitNet(nn.Module):
    """``stem`` (always base, may be empty) -> ``blocks`` -> ``classifier``."""

    def __init__(self, stem: nn.Module, blocks: Iterable[nn.Module], classifier: nn.Module):
        super().__init__()
        self.stem = stem
        self.blocks = nn.ModuleList(blocks)
        self.classifier = classifier

    @property
    def max_personal_layers(self) -> int:
        return len(self.blocks) + 1

    @property
    def output_layer(self) -> nn.Linear:
        """The final linear layer (FedBABU initialises its rows orthogonally)."""
        linears = [m for m in self.classifier.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise TypeError("SplitNet.classifier must end in an nn.Linear")
        return linears[-1]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def head_prefixes(self, personal_layers: int) -> tuple[str, ...]:
        """State-dict key prefixes of the personal head for a given K_P."""
        if not 0 <= personal_layers <= self.max_personal_layers:
            raise ValueError(
                f"model.personal_layers: {personal_layers} is outside 0..{self.max_personal_layers} "
                f"for this model ({len(self.blocks)} blocks + classifier); pick a value in that range"
            )
        if personal_layers == 0:
            return ()
        first_personal_block = len(self.blocks) - (personal_layers - 1)
        return ("classifier.",) + tuple(
            f"blocks.{i}." for i in range(first_personal_block, len(self.blocks))
        )

    def split_keys(self, personal_layers: int) -> tuple[list[str], list[str]]:
        """(base keys, head keys) over the full state dict (parameters *and* buffers)."""
        prefixes = self.head_prefixes(personal_layers)
        base: list[str] = []
        head: list[str] = []
        for key in self.state_dict():
            (head if key.startswith(prefixes) and prefixes else base).append(key)
        return base, head
