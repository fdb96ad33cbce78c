"""What a module logs with ``self.log`` / ``self.log_dict``, gathered per client as Lightning gathers an epoch's."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch
import torchmetrics

from fedsim.core.protocol import RECORD_KEYS
from fedsim.errors import UserCodeError


class LoggedValues:
    """What a module logs with ``self.log`` / ``self.log_dict`` in one client's work, reduced as Lightning reduces
    an epoch's values: the mean weighted by batch size (or ``reduce_fx`` sum, max, min); a torchmetrics object is
    computed once at the end and reset."""

    def __init__(self, module_name: str):
        self.module_name = module_name
        self.batch_size = 1
        self.values: dict[str, tuple[str, torch.Tensor, float]] = {}
        self.metrics: dict[str, torchmetrics.Metric] = {}

    def add(self, name: str, value: Any, reduce_fx: Any = "mean", batch_size: int | None = None) -> None:
        if isinstance(value, torchmetrics.Metric):
            self.metrics[name] = value
            return
        v = value.detach().float() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        if v.numel() != 1:
            raise UserCodeError(f"model.client: {self.module_name} logged {name!r} with {v.numel()} values; "
                                "self.log takes one number (or a torchmetrics object)")
        fx = reduce_fx if isinstance(reduce_fx, str) else getattr(reduce_fx, "__name__", "mean")
        fx = {"amax": "max", "amin": "min"}.get(fx, fx)
        weight = float(batch_size or self.batch_size) if fx == "mean" else 1.0
        v = v.reshape(())
        if name not in self.values:
            self.values[name] = (fx, v * weight, weight)
            return
        _, acc, total = self.values[name]
        combined = {"mean": lambda: acc + v * weight, "sum": lambda: acc + v,
                    "max": lambda: torch.maximum(acc, v), "min": lambda: torch.minimum(acc, v)}
        if fx not in combined:
            raise UserCodeError(f"model.client: {self.module_name} logged {name!r} with reduce_fx={reduce_fx!r}; "
                                "use mean, sum, max or min")
        self.values[name] = (fx, combined[fx](), total + weight)

    def collect(self, suffix: str = "") -> dict[str, float]:
        """The reduced values (names + ``suffix``), then a clean slate."""
        out = {name + suffix: float(acc / total if fx == "mean" else acc) for name, (fx, acc, total) in self.values.items()}
        for name, metric in self.metrics.items():
            out[name + suffix] = float(metric.compute())
            metric.reset()
        self.values, self.metrics = {}, {}
        clash = sorted(set(out) & RECORD_KEYS)
        if clash:
            raise UserCodeError(f"model.client: {self.module_name} logged {clash[0]!r}, a name fedsim's own records use; "
                                "log it under another name")
        return out


def install_logging(module: pl.LightningModule, sink: LoggedValues) -> None:
    """``self.log`` / ``self.log_dict`` with Lightning's signatures, into ``sink`` (numbers, tensors and
    torchmetrics objects; Fabric's own path refuses the last)."""

    def log(name: str, value: Any, *args: Any, reduce_fx: Any = "mean", batch_size: int | None = None,
            **kwargs: Any) -> None:
        sink.add(name, value, reduce_fx, batch_size)

    def log_dict(dictionary: Mapping[str, Any], *args: Any, reduce_fx: Any = "mean", batch_size: int | None = None,
                 **kwargs: Any) -> None:
        for name, value in dict(dictionary).items():
            sink.add(name, value, reduce_fx, batch_size)

    # Instance attributes over the module's own methods, on purpose: set by name, as a type checker refuses assigning
    # to a method.
    for name, method in (("log", log), ("log_dict", log_dict)):
        setattr(module, name, method)


def recorded(method: str, values: dict[str, float]) -> dict[str, float]:
    """What a method's client hook noted with ``ctx.record``, checked against the names fedsim's records use."""
    clash = sorted(set(values) & RECORD_KEYS)
    if clash:
        raise RuntimeError(f"algorithm {method}: ctx.record({clash[0]!r}) uses a name fedsim's own records use")
    return values
