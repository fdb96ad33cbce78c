"""FedBABU's 4-conv CNN for CIFAR: 4 x [conv3x3 64, BN, ReLU, maxpool 2] + Linear(64*2*2, C)."""
from __future__ import annotations

from torch import nn

from fedsim.models.shape import ImageSize, height_width
from fedsim.models.split import SplitNet


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True), nn.MaxPool2d(2)
    )


def cnn4(num_classes: int, in_channels: int = 3, image_size: ImageSize = 32, width: int = 64) -> SplitNet:
    blocks = [_conv_block(in_channels, width)] + [_conv_block(width, width) for _ in range(3)]
    height, wide = (side // 16 for side in height_width(image_size))  # four 2x poolings
    if height < 1 or wide < 1:
        raise ValueError(f"model.name: cnn4 needs images of at least 16x16 pixels, got {image_size}")
    classifier = nn.Sequential(nn.Flatten(), nn.Linear(width * height * wide, num_classes))
    return SplitNet(nn.Identity(), blocks, classifier)
