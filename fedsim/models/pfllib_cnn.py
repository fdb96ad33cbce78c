"""PFLlib's own CNN (``FedAvgCNN``), for cross-checks against PFLlib's numbers: 2 conv + 2 fc, no BatchNorm.

Source: TsingZ0/PFLlib, ``system/flcore/trainmodel/models.py``, class ``FedAvgCNN`` (commit
d832e76f6a23b833038949ec1e4fdefe63a4d350, 2025-11-29)::

    conv1: Conv2d(in, 32, 5, padding=0, stride=1), ReLU, MaxPool2d(2)
    conv2: Conv2d(32, 64, 5, padding=0, stride=1), ReLU, MaxPool2d(2)
    flatten; fc1: Linear(dim, 512), ReLU; fc: Linear(512, num_classes)

``dim`` is what the convolutions leave: PFLlib's ``main.py`` passes 1600 for 32x32 CIFAR (64 x 5 x 5) and 1024 for
28x28 MNIST (64 x 4 x 4); here it follows ``image_size``. Layers and PyTorch's default initialisation are PFLlib's.

As a :class:`SplitNet`: blocks ``[conv1, conv2, fc1]`` and classifier ``fc``, so ``model.personal_layers: 1`` makes
the final Linear the personal head, as PFLlib's FedPer/FedRep/FedBABU split it (``BaseHeadSplit`` with
``head = model.fc``); K_P = 2 adds fc1, and so on.
"""
from __future__ import annotations

from torch import nn

from fedsim.models.shape import ImageSize, height_width
from fedsim.models.split import SplitNet


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 5, padding=0, stride=1, bias=True), nn.ReLU(inplace=True),
                         nn.MaxPool2d(kernel_size=(2, 2)))


def pfllib_cnn(num_classes: int, in_channels: int = 3, image_size: ImageSize = 32, hidden: int = 512) -> SplitNet:
    # two 5x5 valid convolutions, each followed by a 2x2 pooling
    height, width = (((side - 4) // 2 - 4) // 2 for side in height_width(image_size))
    if height < 1 or width < 1:
        given = "x".join(map(str, height_width(image_size)))
        raise ValueError(f"model.name: pfllib_cnn needs inputs of at least 16x16 pixels, got {given}")
    dim = 64 * height * width
    fc1 = nn.Sequential(nn.Flatten(), nn.Linear(dim, hidden), nn.ReLU(inplace=True))
    return SplitNet(nn.Identity(), [_conv_block(in_channels, 32), _conv_block(32, 64), fc1],
                    nn.Linear(hidden, num_classes))
