"""Building a run's plan on the driver: the one place the round-0 model is built from the seed, its
layouts derived and every input checked before anything starts or is written."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytorch_lightning as pl
import torch

from fedsim import storage
from fedsim.algorithms import Algorithm, build_algorithm
from fedsim.config import RunConfig, check_sections
from fedsim.core import runfiles
from fedsim.core.layout import KeyParts
from fedsim.core.protocol import ClientData
from fedsim.data import ArrayDataset, Partition, load_run_data, run_partition
from fedsim.data.validation import validation_splits
from fedsim.errors import ConfigError
from fedsim.models.lightning import (FedClient, build_callbacks, build_client, describe_optimizers, module_optimizers,
                                     network_of, optimizer_parts, overrides, part_parameters, split_keys)
from fedsim.models.packed import why_unpackable
from fedsim.models.shape import check_forward
from fedsim.models.state import frozen_values, layout_of, load_arrays, pack
from fedsim.plan.model import ModelPlan
from fedsim.plan.population import Population
from fedsim.plan.run import RunPlan
from fedsim.plan.system import build_system
from fedsim.plugins import imported_files


def initial_client(cfg: RunConfig, algorithm: Algorithm, num_classes: int,
                   input_shape: tuple[int, int, int]) -> tuple[pl.LightningModule, KeyParts]:
    """The round-0 client module and its body/head split, drawn from the run's seed: the same in every process
    that builds it."""
    torch.manual_seed(cfg.seed)
    module = build_client(cfg.model, num_classes, input_shape, batch_statistics=algorithm.bn_mode == "batch_stats")
    keys = split_keys(module, cfg.model)
    algorithm.init_model(network_of(module), keys)
    return module, keys


def read_initial_weights(run_dir: str) -> dict[str, np.ndarray]:
    """``model.init_from``: the final global weights a finished run saved (its ``model.npz``)."""
    path = storage.user_path(run_dir) / runfiles.MODEL
    if path.exists() and not path.is_file():  # a FIFO would block the read forever, a device never end
        raise ConfigError(f"model.init_from: {path.resolve()} is not a regular file; give the folder of a finished run")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {key: z[key] for key in z.files}
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.init_from: cannot read {path} ({err}); give the folder of a finished run") from None


def build_model_plan(cfg: RunConfig, algorithm: Algorithm, num_classes: int, input_shape: tuple[int, int, int],
                     init_weights: dict[str, np.ndarray] | None = None) -> ModelPlan:
    """The round-0 model as flat vectors, with its layouts: ``shared`` (what the server holds), ``personal``
    (the rest, kept per client) and ``full``; and the client module's optimizers per part, checked."""
    try:
        module, keys = initial_client(cfg, algorithm, num_classes, input_shape)
        net = network_of(module)
        if isinstance(module, FedClient):  # a model fedsim sized from the data (a user's module: its training step)
            check_forward(net, input_shape, num_classes, cfg.model.name)
        if init_weights:
            load_arrays(net, init_weights, "model.init_from")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    shared = algorithm.shared_keys(keys)
    everything = list(net.state_dict())
    layouts = {"shared": layout_of(net, [k for k in everything if k in shared]),
               "personal": layout_of(net, [k for k in everything if k not in shared]),
               "full": layout_of(net, everything)}
    return ModelPlan(layouts, {name: pack(net, layout) for name, layout in layouts.items()}, keys,
                     parameters=sum(p.numel() for p in net.parameters()),
                     state_bytes=sum(t.numel() * t.element_size() for t in net.state_dict().values()),
                     client=cfg.model.client or f"FedClient({cfg.model.name})",
                     optimizers=tuple(checked_optimizers(cfg, module, keys)),
                     own_optimizers=overrides(module, "configure_optimizers"),
                     buffers=frozenset(key for key, _ in net.named_buffers()),
                     unpackable=unpackable(cfg, module, net), frozen=frozen_values(net))


def unpackable(cfg: RunConfig, module: pl.LightningModule, net: torch.nn.Module) -> str | None:
    """Why this client module cannot be trained packed (engine.pack), or None. Packed training computes fedsim's
    own objective with fedsim's own SGD, so only the built-in FedClient as it is, on a network with a packed form."""
    m = cfg.model
    if type(module) is not FedClient:
        return f"model.client {type(module).__name__} has a training_step of its own"
    if m.callbacks or m.client_loop != "fabric" or m.precision not in ("32", "32-true"):
        return "model.callbacks, model.client_loop: trainer and mixed precision need the Lightning loop"
    if "adam" in (cfg.train.body.optimizer, cfg.train.head.optimizer):
        return "packed training steps SGD; train.body / train.head use adam"
    return why_unpackable(net)


def checked_optimizers(cfg: RunConfig, module: pl.LightningModule, keys: KeyParts) -> list[str]:
    """The module's optimizers per part (what ``--dry-run`` prints), after the checks Lightning and fedsim need:
    automatic optimization drives one optimizer, and every trainable parameter is in one."""
    settings = {"body": cfg.train.body, "head": cfg.train.head}
    made = module_optimizers(module, part_parameters(module, keys), settings)
    name = type(module).__name__
    if not overrides(module, "training_step"):
        raise ConfigError(f"model.client: {name} defines no training_step; return the loss from one (automatic "
                          "optimization) or step self.optimizers() in it (manual)")
    if module.automatic_optimization and len(made.optimizers) > 1 and overrides(module, "configure_optimizers"):
        raise ConfigError(f"model.client: {name} returns {len(made.optimizers)} optimizers with automatic optimization; "
                          "Lightning drives one: give it param groups, or set self.automatic_optimization = False "
                          "and step them in training_step")
    covered = {id(p) for opt in made.optimizers for g in opt.param_groups for p in g["params"]}
    missing = [k for k, p in network_of(module).named_parameters() if p.requires_grad and id(p) not in covered]
    if missing:
        raise ConfigError(f"model.client: {name}.configure_optimizers leaves {missing[0]} (and {len(missing) - 1} more) "
                          "out of every optimizer, so it would never train; give every parameter to an optimizer")
    return describe_optimizers(made.optimizers, optimizer_parts(made.optimizers, module, keys))


@dataclass(frozen=True, eq=False)
class Inputs:
    """A run's inputs, checked: its data, partition, method and round-0 model."""
    data: ArrayDataset
    partition: Partition
    algorithm: Algorithm
    model: ModelPlan


def load_inputs(cfg: RunConfig) -> Inputs:
    """Everything that can be wrong with the inputs is found here, before Ray starts or a file is written."""
    # validate() ran these already; a config made by model_copy or built as RunConfig(...) skipped them.
    check_sections(cfg)
    d = cfg.data
    data = load_run_data(d, cfg.seed)  # decodes once; workers then mmap
    partition = run_partition(d, cfg.seed, data)
    init_weights = read_initial_weights(cfg.model.init_from) if cfg.model.init_from else None
    algorithm = build_algorithm(cfg)
    model = build_model_plan(cfg, algorithm, data.num_classes, data.input_shape, init_weights)
    build_callbacks(cfg.model)  # each worker makes its own; a bad one is refused here, before Ray starts
    return Inputs(data, partition, algorithm, model)


def build_plan(cfg: RunConfig, inputs: Inputs, partition: Partition | None = None) -> RunPlan:
    """The run's plan over ``partition`` (a resumed run's own; default: the one the inputs drew)."""
    part = partition or inputs.partition
    maps = part.label_maps
    train, val = validation_splits(part, inputs.data.train_y, cfg.data.validation, cfg.seed,
                                   inputs.data.window)
    clients = tuple(ClientData(train[c], part.test[c], None if maps is None else maps[c], val[c])
                    for c in range(part.num_clients))
    plan = RunPlan(cfg, inputs.algorithm, inputs.model, clients, inputs.data.num_classes, inputs.data.input_shape,
                   Population.of(cfg, part.num_clients), system=build_system(cfg.system, cfg.seed, part.num_clients),
                   code=imported_files(cfg.model_dump()))
    _ = plan.privacy  # DP derived once: z calibrated (or refused), its split checked, before a file is written
    return plan
