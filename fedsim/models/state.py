"""A model's state dict as flat vectors and roles: the torch side of :mod:`fedsim.core.layout`, used where a
model is built (the driver, once per run, and each worker for its own copy)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedsim.core.layout import Layout


def layout_of(net: nn.Module, keys: list[str]) -> Layout:
    state = net.state_dict()
    return Layout.of_shapes(keys, [tuple(state[k].shape) for k in keys])


def pack(net: nn.Module, layout: Layout) -> np.ndarray:
    """The model's values of ``layout`` as one float32 vector (key by key, on the host)."""
    state = net.state_dict()
    out = np.empty(layout.size, dtype=np.float32)
    for key, _, start, end in layout.spans():
        out[start:end] = state[key].detach().reshape(-1).to("cpu", torch.float32).numpy()
    return out


def frozen_values(net: nn.Module) -> int:
    """Values the network holds that never train or travel: its non-persistent buffers' elements (minilm's
    pretrained encoder)."""
    kept = set(net.state_dict())
    return sum(b.numel() for name, b in net.named_buffers() if name not in kept)


def use_batch_statistics(net: nn.Module) -> None:
    """BatchNorm without running statistics (track_running_stats=False): batch statistics in training and
    at test, as the FedBABU authors build their 4-conv CNN and MobileNet."""
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.track_running_stats = False
            for buffer in ("running_mean", "running_var", "num_batches_tracked"):
                m.register_buffer(buffer, None)


@torch.no_grad()
def load_arrays(net: nn.Module, weights: dict[str, np.ndarray], field: str) -> None:
    """Copy named arrays into the model; a key it lacks or a shape that differs is a one-line error on ``field``."""
    state = net.state_dict()
    for key, value in weights.items():
        if key not in state or tuple(state[key].shape) != value.shape:
            raise ValueError(f"{field}: weight {key!r} {value.shape} does not fit this model "
                             f"({tuple(state[key].shape) if key in state else 'no such weight'}); start from a run "
                             "of the same model and model.batchnorm")
        state[key].copy_(torch.from_numpy(value))


def output_layer(net: nn.Module, head_keys: tuple[str, ...]) -> nn.Linear:
    """The head's last ``nn.Linear`` (FedBABU draws its fixed head there)."""
    head = set(head_keys)
    linears = [(name, m) for name, m in net.named_modules() if isinstance(m, nn.Linear)
               and f"{name}.weight" in head]
    if not linears:
        raise ValueError("model.head: the head has no nn.Linear for fedbabu to draw its fixed head in; give the "
                         "head a linear output layer, or set algorithm.params.head_init=linear to keep the module's")
    return linears[-1][1]
