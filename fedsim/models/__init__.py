"""Model registry: every model is a :class:`SplitNet` (blocks + classifier)."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from fedsim.models.cnn4 import cnn4
from fedsim.models.minilm import minilm
from fedsim.models.mlp import linear_base, mlp
from fedsim.models.mobilenet import mobilenet_v1
from fedsim.models.pfllib_cnn import pfllib_cnn
from fedsim.models.resnet import resnet34
from fedsim.models.shape import image_size_of
from fedsim.models.split import SplitNet
from fedsim.models.state import use_batch_statistics
from fedsim.models.text import char_lstm, char_transformer
from fedsim.plugins import Signature, is_plugin, load_plugin, user_call

MODELS: dict[str, Callable[..., SplitNet]] = {
    "cnn4": cnn4, "resnet34": resnet34, "mobilenet_v1": mobilenet_v1, "mlp": mlp, "linear_base": linear_base,
    "pfllib_cnn": pfllib_cnn, "char_lstm": char_lstm, "char_transformer": char_transformer,
    "minilm": minilm,
}
USER_MODEL = Signature(keywords=("num_classes", "in_channels", "image_size"), returns="a fedsim.models.SplitNet")


def build_model(name: str, num_classes: int, input_shape: tuple[int, int, int],
                batch_statistics: bool = False, options: dict[str, Any] | None = None) -> SplitNet:
    """Build a registered model (or a user's ``package.module:function``) for inputs of shape (C, H, W): called as
    ``f(num_classes=, in_channels=C, image_size=)``, image_size the side of square images, else (H, W);
    ``batch_statistics``: BatchNorm without running statistics (model.batchnorm: batch_stats); ``options``
    (model.options): further keyword arguments the function takes (minilm's LoRA rank, ...)."""
    if is_plugin(name):
        factory = load_plugin(name, "model.name", USER_MODEL)
    elif name in MODELS:
        factory = MODELS[name]
    else:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {sorted(MODELS)}")
    options = options or {}
    check_option_names(name, factory, options)
    with user_call(name, "model.name", USER_MODEL):
        net = factory(num_classes=num_classes, in_channels=input_shape[0], image_size=image_size_of(input_shape),
                      **options)
    if not isinstance(net, SplitNet):
        raise ValueError(f"model.name: {name!r} built a {type(net).__name__}; a model must return a "
                         "fedsim.models.SplitNet (stem, blocks, classifier)")
    if batch_statistics:
        use_batch_statistics(net)
    return net


def check_option_names(name: str, factory: Callable[..., SplitNet], options: dict[str, Any]) -> None:
    """model.options names keyword arguments of the model's function beyond those the data gives."""
    offered = [p for p in inspect.signature(factory).parameters if p not in USER_MODEL.keywords]
    unknown = [key for key in options if key not in offered]
    if unknown:
        takes = f"it takes {', '.join(offered)}" if offered else "it takes none"
        raise ValueError(f"model.options: {name} has no option {unknown[0]!r} ({takes}); remove it or fix its name")


__all__ = ["MODELS", "SplitNet", "build_model"]
