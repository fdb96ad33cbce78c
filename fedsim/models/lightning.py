"""LightningModule clients: the built-in :class:`FedClient`, and what fedsim reads from any LightningModule.

Any ``pl.LightningModule`` is a client (``model.client: "package.module:Class"``, built with
``model.client_args`` as keyword arguments). fedsim takes three things from it, each in one function here:

* its **network** (:func:`network_of`): the module's own ``state_dict``, as a Lightning checkpoint holds it;
  FedClient's is the fedsim model it wraps (``net``), so its weights keep the model's own names;
* its **body/head split** (:func:`split_keys`): ``model.parts`` (patterns of tensor names) or ``model.head`` (names
  of submodules) when set, else a fedsim ``SplitNet``'s K_P (``model.personal_layers``), else the module's ``head``
  submodule;
* its **optimizers** (``configure_optimizers``): mapped to body and head by parameter identity
  (:func:`optimizer_parts`). A module that defines none gets one per part from ``train.body``/``train.head``
  (:func:`config_optimizers`), as FedClient does.

The runtime (``fedsim.client``) drives the module's ``training_step`` as Lightning does and enforces what an
algorithm freezes; nothing here trains.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

from fedsim.config import CallbackSpec, ModelConfig, OptimConfig
from fedsim.core.layout import KeyParts
from fedsim.errors import ConfigError, UserCodeError
from fedsim.models import SplitNet, build_model
from fedsim.models.named_parts import head_by_patterns
from fedsim.models.shape import image_size_of
from fedsim.plugins import Subclass, load_plugin

PART_NAMES = ("body", "head")
USER_CLIENT = Subclass(pl.LightningModule, "pytorch_lightning.LightningModule (or fedsim.models.lightning.FedClient)")
USER_CALLBACK = Subclass(pl.Callback, "pytorch_lightning.Callback")
# Arguments fedsim offers a module's __init__ from the data, when it takes them and model.client_args does not.
DATA_ARGUMENTS = ("num_classes", "in_channels", "image_size")


class FedClient(pl.LightningModule):
    """The built-in client: a fedsim model (``net``) trained with manual optimization, one optimizer for the
    body and one for the head (from the config). Subclass it and override ``loss`` to change the objective."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.automatic_optimization = False
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The local objective; override to change it."""
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)  # fedsim adds the algorithm's penalty (FedProx, Ditto, SCAFFOLD) here
        for opt in optimizers:  # a part the phase freezes has no gradients: its optimizer leaves it alone
            opt.step()
        return loss.detach()


def load_client_class(path: str | None) -> type[pl.LightningModule]:
    """``model.client``: a LightningModule class; FedClient by default."""
    if path is None:
        return FedClient
    try:
        cls: type[pl.LightningModule] = load_plugin(path, "model.client", USER_CLIENT)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return cls


def load_callback_classes(model: ModelConfig) -> list[tuple[CallbackSpec, type[pl.Callback]]]:
    """``model.callbacks``: each spec with its Lightning Callback class; checked on the driver before any work (the
    workers make them), so a wrong one is one line before the run folder is written."""
    specs = [spec if isinstance(spec, CallbackSpec) else CallbackSpec(class_path=spec) for spec in model.callbacks]
    try:
        loaded = [(spec, load_plugin(spec.class_path, "model.callbacks", USER_CALLBACK)) for spec in specs]
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for spec, cls in loaded:
        try:
            inspect.signature(cls).bind(**spec.init_args)
        except TypeError as err:
            raise ConfigError(f"model.callbacks: {spec.class_path} cannot be made with init_args {spec.init_args} "
                              f"({err}; it takes {inspect.signature(cls)}); fix its init_args") from None
    return loaded


def build_client(model: ModelConfig, num_classes: int, input_shape: tuple[int, int, int],
                 batch_statistics: bool = False) -> pl.LightningModule:
    """The client module of ``model``: a FedClient (or subclass) around ``model.name``, or the user's own module
    built from ``model.client_args``. Its constructor's errors are one line on ``model.client``."""
    cls = load_client_class(model.client)
    kwargs = client_arguments(cls, model, num_classes, input_shape)
    if issubclass(cls, FedClient):
        try:
            net = build_model(model.name, num_classes, input_shape, options=model.options)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        kwargs = {"net": net, **kwargs}
    elif model.options:
        raise ConfigError(f"model.options: options of model.name's model (sizes, LoRA settings), which "
                          f"{cls.__name__} (model.client) does not use; give your module's own in model.client_args")
    try:
        module = cls(**kwargs)
    except Exception as err:  # the user's constructor: its own message, once, as a config error
        raise ConfigError(f"model.client: {cls.__name__}(**model.client_args) raised {type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no message'}; fix "
                          "model.client_args (keyword arguments of its __init__) or the module") from None
    if batch_statistics:
        from fedsim.models.state import use_batch_statistics

        use_batch_statistics(network_of(module))
    return module


def client_arguments(cls: type[pl.LightningModule], model: ModelConfig, num_classes: int,
                     input_shape: tuple[int, int, int]) -> dict[str, Any]:
    """The keyword arguments fedsim builds ``cls`` with (FedClient's ``net`` aside): ``model.client_args``, and for
    a module of the user's the data's DATA_ARGUMENTS its ``__init__`` takes and the config does not give."""
    kwargs = dict(model.client_args)
    if issubclass(cls, FedClient):
        return kwargs
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    offered = dict(zip(DATA_ARGUMENTS, (num_classes, input_shape[0], image_size_of(input_shape))))
    return {**{k: v for k, v in offered.items() if takes_any or k in accepted}, **kwargs}


def build_callbacks(model: ModelConfig) -> list[pl.Callback]:
    """``model.callbacks``, each made from its class and init_args; whatever a constructor raises is one line naming
    it (made by the driver first, so a bad one is refused before Ray starts or the run folder is written)."""
    built = []
    for spec, cls in load_callback_classes(model):
        try:
            built.append(cls(**spec.init_args))
        except Exception as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
            raise UserCodeError(f"model.callbacks: {spec.class_path} raised {type(err).__name__}: {message}; fix "
                                "its init_args or the class") from None
    return built


def network_of(module: pl.LightningModule) -> nn.Module:
    """The network whose state fedsim federates: FedClient's fedsim model, any other module itself."""
    return module.net if isinstance(module, FedClient) else module


def split_keys(module: pl.LightningModule, model: ModelConfig) -> KeyParts:
    """The body/head split of the module's network, and its BatchNorm keys."""
    net = network_of(module)
    keys = list(net.state_dict())
    if model.parts is not None:
        head = head_by_patterns(keys, model.parts, model.client or model.name)
    elif model.head is None and isinstance(net, SplitNet):  # a fedsim model: K_P is structural
        try:
            head = net.split_keys(model.personal_layers)[1]
        except ValueError as err:
            raise ConfigError(str(err)) from None
    else:
        prefixes = (_submodule_prefixes(net, model.head, "model.head") if model.head is not None
                    else _default_head(net, type(module).__name__, model.personal_layers))
        head = [k for k in keys if prefixes and k.startswith(prefixes)]
    norms = [(name, m) for name, m in net.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    batchnorm = {f"{name}.{key}" if name else key for name, m in norms for key in m.state_dict()}
    statistics = {f"{name}.{key}" if name else key for name, m in norms for key, _ in m.named_buffers()}
    return KeyParts(tuple(k for k in keys if k not in head), tuple(head), frozenset(batchnorm), frozenset(statistics))


def _submodule_prefixes(net: nn.Module, names: list[str], field: str) -> tuple[str, ...]:
    modules = dict(net.named_modules())
    missing = [n for n in names if n not in modules or not n]
    if missing:
        top = [n for n, _ in net.named_children()]
        raise ConfigError(f"{field}: {missing[0]!r} is not a submodule of {type(net).__name__} (its submodules: "
                          f"{', '.join(top)}); name the submodules that form the head")
    return tuple(f"{n}." for n in names)


def _default_head(net: nn.Module, name: str, personal_layers: int) -> tuple[str, ...]:
    """A module's ``head`` submodule is its head (K_P = 0: nothing personal); depth beyond that is model.head's."""
    if personal_layers == 0:
        return ()
    if personal_layers > 1:
        raise ConfigError(f"model.personal_layers: {personal_layers} needs a fedsim SplitNet's blocks; {name} is split "
                          "by its head: list the personal submodules in model.head instead")
    if not isinstance(getattr(net, "head", None), nn.Module):
        top = [n for n, _ in net.named_children()]
        raise ConfigError(f"model.head: {name} has no `head` submodule (its submodules: {', '.join(top)}); name the "
                          "submodules that form its head, e.g. model.head=[classifier]")
    return ("head.",)


def overrides(module: pl.LightningModule, hook: str) -> bool:
    """Whether the module's class defines ``hook`` itself rather than inheriting Lightning's default."""
    return class_overrides(type(module), hook)


def class_overrides(cls: type[pl.LightningModule], hook: str) -> bool:
    return getattr(cls, hook) is not getattr(pl.LightningModule, hook)


def part_parameters(module: pl.LightningModule, keys: KeyParts) -> dict[str, list[nn.Parameter]]:
    named = dict(network_of(module).named_parameters())
    return {"body": [named[k] for k in keys.body if k in named], "head": [named[k] for k in keys.head if k in named]}


def config_optimizers(params: dict[str, list[nn.Parameter]],
                      settings: dict[str, OptimConfig]) -> list[torch.optim.Optimizer]:
    """One optimizer per non-empty part from train.body / train.head: what a module without its own
    configure_optimizers trains with (FedClient's design card: separate base and head optimizers)."""
    out: list[torch.optim.Optimizer] = []
    for part in PART_NAMES:
        s = settings[part]
        if not params[part]:
            continue
        if s.optimizer == "adam":
            out.append(torch.optim.Adam(params[part], lr=s.lr, weight_decay=s.weight_decay))
        else:
            out.append(torch.optim.SGD(params[part], lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay))
    return out


@dataclass(frozen=True)
class Optimizers:
    """What ``configure_optimizers`` returned, in Lightning's forms, flattened."""
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[dict[str, Any]]  # Lightning's dict form: scheduler, interval, frequency


def module_optimizers(module: pl.LightningModule, params: dict[str, list[nn.Parameter]],
                      settings: dict[str, OptimConfig]) -> Optimizers:
    """The module's optimizers and lr schedulers, as Lightning reads ``configure_optimizers`` (an optimizer, a
    list, a dict with ``optimizer`` and ``lr_scheduler``, a list of such dicts, or two lists)."""
    if not overrides(module, "configure_optimizers"):
        return Optimizers(config_optimizers(params, settings), [])
    name = type(module).__name__
    try:
        returned = module.configure_optimizers()
    except Exception as err:
        raise ConfigError(f"model.client: {name}.configure_optimizers raised {type(err).__name__}: {err}") from None
    optimizers, schedulers = _flatten(returned, name)
    if not optimizers:
        raise ConfigError(f"model.client: {name}.configure_optimizers returned no optimizer; return one (or one per "
                          "part), or remove it to train with train.body / train.head")
    return Optimizers(optimizers, schedulers)


def _flatten(returned: Any, name: str) -> tuple[list, list[dict]]:
    if isinstance(returned, torch.optim.Optimizer):
        return [returned], []
    if isinstance(returned, dict):
        return _from_dict(returned, name)
    if isinstance(returned, (list, tuple)):
        if len(returned) == 2 and all(isinstance(x, (list, tuple)) for x in returned):  # ([optimizers], [schedulers])
            return list(returned[0]), [_scheduler_dict(s, name) for s in returned[1]]
        optimizers, schedulers = [], []
        for item in returned:
            o, s = _flatten(item, name)
            optimizers += o
            schedulers += s
        return optimizers, schedulers
    if returned is None:
        return [], []
    raise ConfigError(f"model.client: {name}.configure_optimizers returned a {type(returned).__name__}; return "
                      "optimizers in one of Lightning's forms")


def _from_dict(d: dict, name: str) -> tuple[list, list[dict]]:
    if not isinstance(d.get("optimizer"), torch.optim.Optimizer):
        raise ConfigError(f"model.client: {name}.configure_optimizers returned a dict without an 'optimizer'")
    scheduler = d.get("lr_scheduler")
    return [d["optimizer"]], [] if scheduler is None else [_scheduler_dict(scheduler, name)]


def _scheduler_dict(s: Any, name: str) -> dict[str, Any]:
    entry = dict(s) if isinstance(s, dict) else {"scheduler": s}
    interval = entry.setdefault("interval", "epoch")
    entry.setdefault("frequency", 1)
    if interval not in ("epoch", "step"):
        raise ConfigError(f"model.client: {name}'s lr scheduler interval {interval!r}; use 'epoch' or 'step'")
    if "monitor" in entry or type(entry["scheduler"]).__name__ == "ReduceLROnPlateau":
        raise ConfigError(f"model.client: {name}'s ReduceLROnPlateau (a monitored scheduler) has no validation "
                          "metric inside a local update; use an epoch or step schedule")
    return entry


def optimizer_parts(optimizers: list[torch.optim.Optimizer], module: pl.LightningModule,
                    keys: KeyParts) -> list[list[frozenset[str]]]:
    """Per optimizer, per param group: the parts (body, head) its parameters belong to, by identity."""
    part_of = {id(p): part for part, ps in part_parameters(module, keys).items() for p in ps}
    return [[frozenset(part_of.get(id(p), "other") for p in g["params"]) for g in opt.param_groups]
            for opt in optimizers]


def describe_optimizers(optimizers: list[torch.optim.Optimizer], parts: list[list[frozenset[str]]]) -> list[str]:
    """One line per param group: the parts it trains, its optimizer type and settings (``--dry-run`` prints them)."""
    lines = []
    for i, (opt, groups) in enumerate(zip(optimizers, parts)):
        for j, (group, owned) in enumerate(zip(opt.param_groups, groups)):
            settings = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in group.items()
                                 if k in ("lr", "momentum", "weight_decay", "betas", "eps", "nesterov"))
            lines.append(f"{'+'.join(sorted(owned))}: {type(opt).__name__} (optimizer {i}, group {j}, "
                         f"{len(group['params'])} tensors): {settings}")
    return lines
