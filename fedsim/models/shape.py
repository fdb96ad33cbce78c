"""The image size a model is built for: ``image_size`` is the side of square images (an int, what every model took
before) or ``(height, width)`` for images that are not square; and the forward pass that checks a built model takes
the data's images before any run starts."""
from __future__ import annotations

import torch
from torch import nn

ImageSize = int | tuple[int, int]


def image_size_of(input_shape: tuple[int, int, int]) -> ImageSize:
    """What a model factory (or a module's ``image_size`` argument) is given for inputs of shape (C, H, W): the side
    of square images, else (height, width)."""
    _, height, width = input_shape
    return height if height == width else (height, width)


def height_width(image_size: ImageSize) -> tuple[int, int]:
    """(height, width) of an ``image_size`` argument, either form."""
    return (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))


def check_forward(net: nn.Module, input_shape: tuple[int, int, int], num_classes: int, name: str) -> None:
    """One forward pass of two blank images of the data's shape, in evaluation mode and without gradients (no
    weight, statistic or random state changes): a model sized for other images is one line on model.name here, at
    --dry-run too, not a shape error in every worker. Raises ValueError."""
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(torch.zeros(2, *input_shape))
    except RuntimeError as err:
        raise ValueError(f"model.name: {name} cannot take the data's {'x'.join(map(str, input_shape))} (CxHxW) images "
                         f"({str(err).strip().splitlines()[0]}); size the model from image_size (an int, or (height, "
                         "width) for images that are not square) or choose another model") from None
    finally:
        net.train(was_training)
    if tuple(out.shape) != (2, num_classes):
        raise ValueError(f"model.name: {name} gives outputs of shape {tuple(out.shape)} for 2 images; a classifier of "
                         f"{num_classes} classes gives (2, {num_classes})")
