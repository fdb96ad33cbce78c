"""Model registry: every model is a :class:`SplitNet` (blocks + classifier)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedsim.models.cnn4 import cnn4
from fedsim.models.minilm import MINILM_OPTIONS, minilm
from fedsim.models.mlp import linear_base, mlp
from fedsim.models.mobilenet import mobilenet_v1
from fedsim.models.pfllib_cnn import pfllib_cnn
from fedsim.models.resnet import resnet34
from fedsim.models.shape import image_size_of
from fedsim.models.split import SplitNet
from fedsim.models.state import use_batch_statistics
from fedsim.models.text import LSTM_SIZES, TRANSFORMER_SIZES, char_lstm, char_transformer
from fedsim.plugins import Signature, is_plugin, load_plugin, user_call

MODELS: dict[str, Callable[..., SplitNet]] = {
    "cnn4": cnn4, "resnet34": resnet34, "mobilenet_v1": mobilenet_v1, "mlp": mlp, "linear_base": linear_base,
    "pfllib_cnn": pfllib_cnn, "char_lstm": char_lstm, "char_transformer": char_transformer,
    "minilm": minilm,
}
USER_MODEL = Signature(keywords=("num_classes", "in_channels", "image_size"), returns="a fedsim.models.SplitNet")


# The models that take sizes from model.options: each size's name and default.
SIZES: dict[str, dict[str, int]] = {"char_lstm": LSTM_SIZES, "char_transformer": TRANSFORMER_SIZES}
# Every model that takes model.options, with each option's default: the sizes, and minilm's LoRA settings (which its
# own function checks: a rate, a list of layers and whole numbers, not sizes alone).
OPTIONS: dict[str, Mapping[str, Any]] = {**SIZES, "minilm": MINILM_OPTIONS}


def build_model(name: str, num_classes: int, input_shape: tuple[int, int, int],
                batch_statistics: bool = False, options: Mapping[str, Any] | None = None) -> SplitNet:
    """Build a registered model (or a user's ``package.module:function``) for inputs of shape (C, H, W): called as
    ``f(num_classes=, in_channels=C, image_size=)``, image_size the side of square images, else (H, W), and the
    options ``options`` gives (model.options: only for the models in ``OPTIONS``); ``batch_statistics``: BatchNorm
    without running statistics (model.batchnorm: batch_stats)."""
    if is_plugin(name):
        factory = load_plugin(name, "model.name", USER_MODEL)
    elif name in MODELS:
        factory = MODELS[name]
    else:
        raise ValueError(f"model.name: unknown model {name!r}; choose one of {sorted(MODELS)}")
    chosen = model_options(name, options or {})
    with user_call(name, "model.name", USER_MODEL):
        net = factory(num_classes=num_classes, in_channels=input_shape[0], image_size=image_size_of(input_shape),
                      **chosen)
    if not isinstance(net, SplitNet):
        raise ValueError(f"model.name: {name!r} built a {type(net).__name__}; a model must return a "
                         "fedsim.models.SplitNet (stem, blocks, classifier)")
    if batch_statistics:
        use_batch_statistics(net)
    return net


def model_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``model.options`` checked against the options ``name`` takes (one line naming the field and the fix); sizes
    must be whole numbers >= 1."""
    if name not in OPTIONS:
        if options:
            raise ValueError(f"model.options: {name} takes no options (only {', '.join(OPTIONS)} take them); "
                             "leave model.options out")
        return {}
    defaults = OPTIONS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        kind = "size" if name in SIZES else "option"
        raise ValueError(f"model.options: {name} has no {kind} {unknown[0]!r}; give {', '.join(defaults)}")
    if name not in SIZES:
        return {**defaults, **options}
    for key, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"model.options.{key}: {name} needs a whole number >= 1, got {value!r}")
    sizes = {**defaults, **options}
    if name == "char_transformer" and sizes["width"] % sizes["heads"]:
        raise ValueError(f"model.options.heads: {sizes['heads']} heads do not divide width {sizes['width']}; give "
                         "heads that divide it")
    return sizes


__all__ = ["MODELS", "SplitNet", "build_model"]
