"""A network's forward pass for G clients at once, each with its own weights (packed training, engine.pack).

The G clients' tensors are stacked along a new first dimension (the pack *slot*). Activations are laid out as
(B, G*C, ...): slot g owns the channel block [g*C, (g+1)*C). Every layer is then one standard kernel over the
whole pack: a convolution with G times its groups, batch norm over G*C channels (each slot's batch statistics and
running statistics are its own), elementwise ops and pooling unchanged (they act per channel), a linear layer as
one batched matmul. No slot's values ever mix with another's, so a client's result does not depend on which
clients share its pack (checked bit for bit in tests/client/test_packed.py) -- only a pack of one takes other
kernels (an ungrouped convolution), so the trainer never runs one.

Only layers whose packed form is known are translated: a network with anything else (a user's own module, dropout,
whose randomness would come from torch's global generator) raises :class:`Unpackable`, and the run trains its
clients one after another instead.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from fedsim.models.resnet import BasicBlock
from fedsim.models.split import SplitNet

Tensors = Mapping[str, torch.Tensor]  # state-dict key -> that key's tensors of every slot, stacked: (G, *shape)
Layer = Callable[[torch.Tensor, Tensors, bool], torch.Tensor]  # (activations, stacked state, training) -> activations

# Modules that act on each channel (or value) alone: applied to the packed activations as they are.
CHANNELWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Hardswish,
               nn.Identity, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)


class Unpackable(ValueError):
    """The network has a layer without a packed form (the message names it)."""


def _conv(prefix: str, m: nn.Conv2d) -> Layer:
    if m.padding_mode != "zeros":
        raise Unpackable(f"{prefix or 'the network'}: Conv2d with padding_mode={m.padding_mode!r}")

    def layer(h: torch.Tensor, s: Tensors, training: bool) -> torch.Tensor:
        w = s[prefix + "weight"]
        bias = s.get(prefix + "bias")
        return F.conv2d(h, w.reshape(-1, *w.shape[2:]), None if bias is None else bias.reshape(-1), m.stride,
                        m.padding, m.dilation, groups=w.shape[0] * m.groups)
    return layer


def _batch_norm(prefix: str, m: nn.modules.batchnorm._BatchNorm) -> Layer:
    momentum = m.momentum
    if momentum is None:  # a cumulative average would weight by each slot's own step count
        raise Unpackable(f"{prefix}: BatchNorm with momentum=None")

    def layer(h: torch.Tensor, s: Tensors, training: bool) -> torch.Tensor:
        mean, var = s.get(prefix + "running_mean"), s.get(prefix + "running_var")
        weight, bias = s.get(prefix + "weight"), s.get(prefix + "bias")
        flat = [None if t is None else t.view(-1) if t.is_contiguous() else t.reshape(-1) for t in (weight, bias)]
        if mean is not None and training:
            s[prefix + "num_batches_tracked"].add_(1)
        return F.batch_norm(h, None if mean is None else mean.view(-1), None if var is None else var.view(-1),
                            flat[0], flat[1], training or mean is None, momentum, m.eps)
    return layer


ALIGN = 16  # floats (64 bytes): every slot's block of a batched matmul starts at such a boundary


def _linear(prefix: str) -> Layer:
    def layer(h: torch.Tensor, s: Tensors, training: bool) -> torch.Tensor:
        w, bias = s[prefix + "weight"], s.get(prefix + "bias")
        g, out_features, in_features = w.shape
        x = h.reshape(h.shape[0], g, in_features).transpose(0, 1)  # (G, B, in)
        # One batched matmul, each slot's matrices padded with zeros to a multiple of ALIGN values: BLAS kernels
        # round differently for differently aligned operands (measured: without the padding a slot's logits changed
        # with its place in the pack). The bias is a weight column on a constant input, so its gradient also comes
        # from the matmul, one product per slot: a broadcast bias's gradient is a reduction over (G, B, out) whose
        # vectorisation changes with G.
        ones = [x.new_ones(*x.shape[:2], 1)] if bias is not None else []
        columns = [w] + ([bias.unsqueeze(2)] if bias is not None else [])
        inner = in_features + len(ones)
        pad_in, pad_out = -inner % ALIGN, -out_features % ALIGN
        x = torch.cat([x, *ones, x.new_zeros(*x.shape[:2], pad_in)], dim=2)
        w = torch.cat([*columns, w.new_zeros(g, out_features, pad_in)], dim=2)
        w = torch.cat([w, w.new_zeros(g, pad_out, w.shape[2])], dim=1)
        y = torch.bmm(x, w.transpose(1, 2))[:, :, :out_features]
        return y.transpose(0, 1).reshape(h.shape[0], g * out_features)
    return layer


def _flatten(prefix: str, m: nn.Flatten) -> Layer:
    if (m.start_dim, m.end_dim) != (1, -1):
        raise Unpackable(f"{prefix or 'the network'}: Flatten(start_dim={m.start_dim}, end_dim={m.end_dim})")
    # Slot g's (C, H, W) values are contiguous in logical order, so flattening keeps each slot's block whole.
    return lambda h, s, training: h.reshape(h.shape[0], -1)


def _sequence(layers: list[Layer]) -> Layer:
    def layer(h: torch.Tensor, s: Tensors, training: bool) -> torch.Tensor:
        for each in layers:
            h = each(h, s, training)
        return h
    return layer


def _basic_block(prefix: str, m: BasicBlock) -> Layer:
    """fedsim's ResNet block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""
    first = _sequence([_conv(prefix + "conv1.", m.conv1), _batch_norm(prefix + "bn1.", m.bn1)])
    second = _sequence([_conv(prefix + "conv2.", m.conv2), _batch_norm(prefix + "bn2.", m.bn2)])
    shortcut = translate(m.shortcut, prefix + "shortcut.")
    return lambda h, s, training: F.relu(second(F.relu(first(h, s, training)), s, training) + shortcut(h, s, training))


def translate(module: nn.Module, prefix: str = "") -> Layer:
    """The packed form of ``module`` (its state-dict keys under ``prefix``), or :class:`Unpackable`."""
    if isinstance(module, SplitNet):
        if type(module).forward is not SplitNet.forward or type(module).features is not SplitNet.features:
            raise Unpackable(f"{type(module).__name__} has a forward of its own")
        return _sequence([translate(module.stem, "stem."),
                          *(translate(b, f"blocks.{i}.") for i, b in enumerate(module.blocks)),
                          translate(module.classifier, "classifier.")])
    if type(module) in (nn.Sequential, nn.ModuleList):
        return _sequence([translate(child, f"{prefix}{name}.") for name, child in module.named_children()])
    if type(module) is nn.Conv2d:
        return _conv(prefix, module)
    if type(module) is nn.BatchNorm1d or type(module) is nn.BatchNorm2d:
        return _batch_norm(prefix, module)
    if type(module) is nn.Linear:
        return _linear(prefix)
    if type(module) is nn.Flatten:
        return _flatten(prefix, module)
    if type(module) is BasicBlock:
        return _basic_block(prefix, module)
    if type(module) in CHANNELWISE:
        return lambda h, s, training: module(h)
    raise Unpackable(f"{prefix.rstrip('.') or 'the network'}: {type(module).__name__} has no packed form")


class PackedNet:
    """A network's packed forward: ``logits = packed(x, state, training)`` for x of shape (G, B, *input) and
    ``state`` each state-dict key's tensors stacked over the G slots; returns (G, B, classes). In training, the
    BatchNorm running statistics in ``state`` are updated in place, each slot's from its own batch."""

    def __init__(self, net: nn.Module, channels_last: bool = False):
        self.forward = translate(net)
        self.channels_last = channels_last

    def __call__(self, x: torch.Tensor, state: dict[str, torch.Tensor], training: bool) -> torch.Tensor:
        g, b = x.shape[:2]
        h = x.transpose(0, 1).reshape(b, g * x.shape[2], *x.shape[3:])  # slot g's channels: block g
        if self.channels_last and h.dim() == 4:
            h = h.contiguous(memory_format=torch.channels_last)
        out = self.forward(h, state, training)
        return out.reshape(b, g, -1).transpose(0, 1)


def why_unpackable(net: nn.Module) -> str | None:
    """None if ``net`` has a packed form, else why not (one line)."""
    try:
        translate(net)
    except Unpackable as err:
        return str(err)
    return None
