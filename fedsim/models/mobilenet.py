"""CIFAR MobileNet-v1: 3x3 stem, 13 depthwise-separable blocks, global pool + linear."""
from __future__ import annotations

from torch import nn

from fedsim.models.shape import ImageSize
from fedsim.models.split import SplitNet

# (out_channels, stride) of each depthwise-separable block, as in the original v1 (stride-1 first
# block and 32x32 input adaptation for CIFAR).
_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
           (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))


def _separable(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False), nn.BatchNorm2d(c_in), nn.ReLU(inplace=True),
        nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
    )


def mobilenet_v1(num_classes: int, in_channels: int = 3, image_size: ImageSize = 32) -> SplitNet:
    stem = nn.Sequential(nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
    blocks, c_in = [], 32
    for c_out, stride in _BLOCKS:
        blocks.append(_separable(c_in, c_out, stride))
        c_in = c_out
    classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes))
    return SplitNet(stem, blocks, classifier)
