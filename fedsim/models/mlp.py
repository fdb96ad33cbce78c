"""Fully connected nets: an MLP for feature data (Synthetic) and FedPer's linear-base ablation."""
from __future__ import annotations

from torch import nn

from fedsim.models.shape import ImageSize, height_width
from fedsim.models.split import SplitNet


def _pixels(image_size: ImageSize) -> int:
    height, width = height_width(image_size)
    return height * width


def mlp(num_classes: int, in_channels: int = 60, image_size: ImageSize = 1, hidden: int = 64,
        depth: int = 2) -> SplitNet:
    """``depth`` hidden blocks [Linear, ReLU] and a linear classifier."""
    width = in_channels * _pixels(image_size)
    blocks = []
    for _ in range(depth):
        blocks.append(nn.Sequential(nn.Linear(width, hidden), nn.ReLU(inplace=True)))
        width = hidden
    return SplitNet(nn.Flatten(), blocks, nn.Linear(width, num_classes))


def linear_base(num_classes: int, in_channels: int = 3, image_size: ImageSize = 32, width: int = 256) -> SplitNet:
    """FedPer's Knowl 7 ablation: the deep base replaced by one linear layer onto cnn4's 256 features,
    so the personal classifier (K_P = 1) is the same Linear(256, C) as cnn4's."""
    base = nn.Sequential(nn.Linear(in_channels * _pixels(image_size), width), nn.ReLU(inplace=True))
    return SplitNet(nn.Flatten(), [base], nn.Linear(width, num_classes))
