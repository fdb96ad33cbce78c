"""CIFAR ResNet-34: 3x3 stem, 16 BasicBlocks in stages [3, 4, 6, 3], global pool + linear."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fedsim.models.shape import ImageSize
from fedsim.models.split import SplitNet


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet34(num_classes: int, in_channels: int = 3, image_size: ImageSize = 32) -> SplitNet:
    stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
    blocks: list[nn.Module] = []
    c_in = 64
    for c_out, depth, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(depth):
            blocks.append(BasicBlock(c_in, c_out, stride if i == 0 else 1))
            c_in = c_out
    classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))
    return SplitNet(stem, blocks, classifier)
