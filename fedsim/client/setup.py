"""A worker's set-up: the client module built from the seed, its device and memory format, the Fabric that drives
it, its optimizers for training and for evaluation's fine-tuning, its callbacks, and its layouts bound to it."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pytorch_lightning as pl
import ray
import torch

from fedsim.client.device import make_cuda_deterministic
from fedsim.client.fabric import FedsimFabric
from fedsim.client.loop import LocalLoop
from fedsim.client.optimizers import OptimizerSet
from fedsim.client.resident import BoundLayout
from fedsim.client.settings import OptimizerSettings
from fedsim import storage
from fedsim.config import RunConfig
from fedsim.core import runfiles
from fedsim.core.layout import KeyParts
from fedsim.errors import UserCodeError
from fedsim.models.lightning import (build_callbacks, config_optimizers, module_optimizers, network_of,
                                     optimizer_parts, overrides, part_parameters)
from fedsim.plan import WorkerPlan
from fedsim.plan.build import initial_client


@dataclass(frozen=True)
class WorkerModel:
    """The one network a worker's clients train in turn, and what drives it."""
    net: torch.nn.Module
    loop: LocalLoop
    device: torch.device
    channels_last: bool
    layouts: dict[str, BoundLayout]
    settings: OptimizerSettings
    part_of: dict[str, str]  # state key -> body or head
    parameter_keys: frozenset[str]  # the state keys that are parameters (the rest are buffers)

    def trainable(self, parts: frozenset[str]) -> list[str]:
        """The parameters of ``parts``, by state-dict key in the full layout's order."""
        return [k for k in self.layouts["full"].keys if k in self.parameter_keys and self.part_of[k] in parts]


def configure_process(cfg: RunConfig) -> None:
    """The worker process's torch threads (engine.threads_per_worker), and Lightning's notices kept quiet."""
    torch.set_num_threads(cfg.engine.threads_per_worker)
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)


def set_up_worker(plan: WorkerPlan) -> WorkerModel:
    """The worker's model as the driver built it from the seed: its values are the plan's round-0 model."""
    cfg = plan.cfg
    module, keys = initial_client(cfg, plan.algorithm, plan.num_classes, plan.input_shape)
    net = network_of(module)
    on_gpu = assigned_gpu()
    if on_gpu:
        make_cuda_deterministic()
    fmt = cfg.engine.memory_format
    channels_last = fmt == "channels_last" or (fmt == "auto" and not on_gpu)
    if channels_last:  # packing reads logical order (reshape), so flat vectors do not change
        net.to(memory_format=torch.channels_last)
    # Fabric rather than a Trainer: a Trainer costs ~7 ms per fit and must be coaxed into refitting; Fabric adds
    # ~0.1-2 ms per client and still runs the module's own training_step (docs/stack-notes.md).
    fabric = FedsimFabric(accelerator="cuda" if on_gpu else "cpu", devices=1, precision=cfg.model.precision)
    settings = OptimizerSettings(cfg, plan.model.own_optimizers)  # the driver's reading of the module
    train = training_optimizers(module, keys, fabric, settings)
    with_trainer = cfg.model.client_loop == "trainer"
    own, listed = callbacks(module, cfg, with_trainer)
    # Under the Trainer loop the callbacks are each local update's Trainer's (it makes and calls them); fedsim's own
    # scoring is no Trainer stage, so it calls the module's hooks alone (a ModelCheckpoint's on_validation_end reads
    # Trainer-only state, and would save on every client's scoring).
    hooked = [] if with_trainer else [*own, *listed]
    loop = LocalLoop(module, fabric, {"train": train, "finetune": finetune_optimizers(module, keys, fabric, settings,
                                                                                        train)},
                     keys, hooked, plan.num_classes, listed, cfg.model.precision,
                     with_trainer, lightning_folder(cfg))
    layouts = {name: BoundLayout.bind(layout, net, fabric.device) for name, layout in plan.model.layouts.items()}
    layouts["full"].load(plan.model.initial["full"])
    return WorkerModel(net, loop, fabric.device, channels_last, layouts, settings,
                       {**dict.fromkeys(keys.body, "body"), **dict.fromkeys(keys.head, "head")},
                       frozenset(key for key, _ in net.named_parameters()))


def assigned_gpu() -> bool:
    return bool(ray.is_initialized() and ray.get_gpu_ids()) and torch.cuda.is_available()


def training_optimizers(module: pl.LightningModule, keys: KeyParts, fabric: FedsimFabric,
                        settings: OptimizerSettings) -> OptimizerSet:
    """The module's configure_optimizers, or fedsim's own per part; the module learns its Fabric and optimizers."""
    made = module_optimizers(module, part_parameters(module, keys), settings.made_with(finetune=False))
    _, *wrapped = fabric.setup(module, *made.optimizers)
    return OptimizerSet(made.optimizers, made.schedulers, wrapped, optimizer_parts(made.optimizers, module, keys))


def finetune_optimizers(module: pl.LightningModule, keys: KeyParts, fabric: FedsimFabric, settings: OptimizerSettings,
                        train: OptimizerSet) -> OptimizerSet:
    """Evaluation fine-tuning's optimizers: a module's own (each update starts them afresh anyway), or fedsim's own
    made for fine-tuning."""
    if settings.own_optimizers:
        return train
    optimizers = config_optimizers(part_parameters(module, keys), settings.made_with(finetune=True))
    wrapped = fabric.setup_optimizers(*optimizers)
    return OptimizerSet(optimizers, [], list(wrapped) if isinstance(wrapped, tuple) else [wrapped],
                        optimizer_parts(optimizers, module, keys))


def callbacks(module: pl.LightningModule, cfg: RunConfig,
              with_trainer: bool) -> tuple[list[pl.Callback], list[pl.Callback]]:
    """The module's configure_callbacks and model.callbacks, as Lightning would use them in every fit. The Fabric loop
    sets them up here, once; a Trainer sets them up in each fit itself."""
    try:
        own = module.configure_callbacks() if overrides(module, "configure_callbacks") else []
    except Exception as err:
        raise UserCodeError(f"model.client: {type(module).__name__}.configure_callbacks raised {type(err).__name__}: "
                            f"{_first_line(err)}; fix the module") from None
    # As Lightning's Trainer reads it: a Sequence is the callbacks, anything else one callback.
    own = list(own) if isinstance(own, Sequence) else [own]
    listed = build_callbacks(cfg.model)
    for cb in own:
        if not isinstance(cb, pl.Callback):
            raise UserCodeError(f"model.client: {type(module).__name__}.configure_callbacks returned a "
                                f"{type(cb).__name__}, not a pytorch_lightning Callback")
    if not with_trainer:
        for cb in [*own, *listed]:
            _set_up_under_fabric(cb, module)
    return own, listed


def _set_up_under_fabric(cb: pl.Callback, module: pl.LightningModule) -> None:
    """``cb.setup`` with the module's trainer, which for the Fabric loop is its Fabric: a callback that reads a
    Trainer's attributes (Lightning's ModelCheckpoint, EarlyStopping) fails here, named, with the fix."""
    try:
        cb.setup(module.trainer, module, "fit")
    except Exception as err:
        needs = (f"; it needs a pl.Trainer, which the fabric loop does not give it: set model.client_loop: trainer"
                 if isinstance(err, AttributeError) else "; fix the callback")
        raise UserCodeError(f"model.callbacks: {type(cb).__name__}.setup raised {type(err).__name__}: "
                            f"{_first_line(err)}{needs}") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else "no message"


def lightning_folder(cfg: RunConfig) -> str | None:
    """Where a local update's Trainer keeps what Lightning's callbacks write (ModelCheckpoint's files): the run
    folder's ``lightning/``; a run in a bucket leaves Lightning its default (the worker's directory)."""
    location = storage.join(cfg.out_dir, cfg.name, runfiles.LIGHTNING)
    return None if storage.is_uri(location) else storage.anchored(location)
