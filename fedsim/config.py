"""Typed run configuration: YAML file + ``key=value`` overrides -> validated :class:`RunConfig`."""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from fedsim import strict_yaml


class ConfigError(ValueError):
    """A one-line, user-facing configuration problem (names the field and the fix)."""


def _scalar_types(annotation: Any) -> set:
    """``int | None`` -> {int, NoneType}; ``Literal[...]``, ``dict[...]`` -> their origin."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_scalar_types(a) for a in typing.get_args(annotation)))
    return {origin or annotation}


class _Section(BaseModel):
    # inf/nan are never meaningful settings (round_timeout_s: .inf would reach Ray as a timeout).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_number_confusion(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic's lax mode turns true into 1 and 1 into true; in a config that is always a typo."""
        wanted = _scalar_types(cls.model_fields[info.field_name].annotation)
        if bool in wanted and not isinstance(value, bool) and not (value is None and type(None) in wanted):
            raise ValueError("expected true or false")
        if isinstance(value, bool) and bool not in wanted and wanted & {int, float}:
            raise ValueError("expected a number, not true/false")
        return value


class PartitionSettings(_Section):
    """Which samples each client holds: ``data.partition: {name: dirichlet, beta: 0.3}`` (a bare name keeps the
    kind's defaults). Each kind takes only its own settings."""
    name: str

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of ``fedsim.data.make_partition`` for this kind."""
        return {}


class IidPartition(PartitionSettings):
    name: Literal["iid"] = "iid"


class ClassesPartition(PartitionSettings):
    name: Literal["classes"] = "classes"
    k: int = Field(4, ge=1, description="at most k classes per client (FedPer), each class split among its holders")

    def arguments(self) -> dict[str, Any]:
        return {"k": self.k}


class ShardsPartition(PartitionSettings):
    name: Literal["shards"] = "shards"
    shards_per_client: int = Field(ge=1, description="s: shards per client")
    style: Literal["fedbabu", "sorted_pool"] = Field(
        "fedbabu", description="fedbabu = single-class shards, test set of the train class mix and equal size "
        "(FedBABU's noniid); sorted_pool = fedsim's earlier label-sorted cut, to reproduce old runs")

    def arguments(self) -> dict[str, Any]:
        return {"shards_per_client": self.shards_per_client, "shard_style": self.style}


class DirichletPartition(PartitionSettings):
    name: Literal["dirichlet"] = "dirichlet"
    beta: float = Field(gt=0, description="concentration: 0.1 = strong label skew, 100 = near iid")

    def arguments(self) -> dict[str, Any]:
        return {"beta": self.beta}


class ConflictingPartition(PartitionSettings):
    name: Literal["conflicting"] = "conflicting"
    agreed: float = Field(0.0, ge=0, lt=1, description="fraction of the classes (the first round(agreed x C)) that "
                          "keep their true label at every client; the others are permuted per client (0 = every "
                          "class, so FedAvg is at chance by construction)")

    def arguments(self) -> dict[str, Any]:
        return {"agreed": self.agreed}


class NaturalPartition(PartitionSettings):
    name: Literal["natural"] = "natural"


class UserPartition(PartitionSettings):
    """A user's ``package.module:function``."""

    @field_validator("name")
    @classmethod
    def _a_plugin(cls, name: str) -> str:
        if ":" not in name:
            raise ValueError(f"unknown partition {name!r}; choose one of {', '.join(PARTITIONS)} or give "
                             "'package.module:function'")
        return name


PARTITIONS: dict[str, type[PartitionSettings]] = {cls.model_fields["name"].default: cls for cls in (
    IidPartition, ClassesPartition, ShardsPartition, DirichletPartition, ConflictingPartition, NaturalPartition)}
# Flat keys of fedsim before partitions were typed: flat key -> (the kind it belongs to, its name there, its old
# default). They keep working: moved into the partition they belong to, ignored by the others (as before).
FLAT_PARTITION_KEYS = {"k": ("classes", "k", 4), "shards_per_client": ("shards", "shards_per_client", None),
                       "shard_style": ("shards", "style", "fedbabu"), "beta": ("dirichlet", "beta", None)}


def _typed_partition(value: Any) -> PartitionSettings:
    if isinstance(value, PartitionSettings):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"data.partition: expected a name or {{name: ..., its settings}}, got {_SHORT.repr(value)}")
    return PARTITIONS.get(value.get("name"), UserPartition).model_validate(value)


class DataConfig(_Section):
    dataset: str = "cifar10"
    root: str | None = Field(None, description="folder holding the data; default: env FEDSIM_DATA")
    download: bool = Field(False, description="let torchvision download when the data is missing (needs internet)")
    num_clients: int = Field(10, ge=1)
    partition: SerializeAsAny[PartitionSettings] = Field(
        default_factory=ClassesPartition, description="iid, classes {k}, shards {shards_per_client, style}, "
        "dirichlet {beta}, conflicting {agreed}, natural, or a user's 'package.module:function'")
    options: dict[str, Any] = Field(default_factory=dict, description="dataset options, e.g. synthetic alpha/beta")
    train_fraction: float = Field(1.0, gt=0, le=1)
    test_fraction: float = Field(1.0, gt=0, le=1)
    augment: bool = Field(True, description="random crop + horizontal flip during local training")

    @model_validator(mode="before")
    @classmethod
    def _partition_with_its_settings(cls, data: Any) -> Any:
        """``partition: dirichlet`` -> ``{name: dirichlet}``; the flat keys of before move into the partition."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        partition = data.get("partition", "classes")
        partition = {"name": partition} if isinstance(partition, str) else partition
        if isinstance(partition, dict):
            partition = dict(partition)
            for key, (kind, name, _) in FLAT_PARTITION_KEYS.items():
                if key not in data:
                    continue
                value = data.pop(key)
                if partition.get("name") != kind:
                    continue  # another kind's setting: it never changed this partition
                if name in partition and partition[name] != value:
                    raise ValueError(f"data.{key}: given twice, also as data.partition.{name}; keep data.partition.{name}")
                partition[name] = value
        data["partition"] = partition
        return data

    @field_validator("partition", mode="before")
    @classmethod
    def _partition_kind(cls, value: Any) -> PartitionSettings:
        try:
            return _typed_partition(value)
        except ValidationError as err:
            raise ValueError(_format_error(err, prefix="data.partition")) from None


class CallbackSpec(_Section):
    """A callback as Lightning's CLI names one."""
    class_path: str = Field(description="'package.module:Class' of a pytorch_lightning Callback")
    init_args: dict[str, Any] = Field({}, description="keyword arguments of its __init__")


class ModelConfig(_Section):
    name: str = Field("cnn4", description="a registered model or a user's 'package.module:function'")
    personal_layers: int = Field(1, ge=0, description="K_P: classifier + the last K_P-1 blocks are personal")
    client: str | None = Field(None, description="'package.module:Class' of your own LightningModule (docs/lightning.md); "
                               "null: the built-in FedClient around model.name")
    client_args: dict[str, Any] = Field({}, description="keyword arguments of model.client's __init__ (num_classes, "
                                        "in_channels, image_size come from the data when it takes them)")
    head: list[str] | None = Field(None, description="the module's submodules that form the head (personal under "
                                   "FedPer, fixed under FedBABU); null: a fedsim model's K_P, else its `head` submodule")
    callbacks: list[str | CallbackSpec] = Field([], description="Lightning callbacks for every local update: "
                                               "'package.module:Class' or {class_path: ..., init_args: {...}}")
    precision: Literal["32", "32-true", "16-mixed", "bf16-mixed"] = Field(
        "32", description="Lightning precision of local training and scoring, through Fabric (16-mixed needs a GPU)")
    client_loop: Literal["fabric", "trainer"] = Field(
        "fabric", description="fabric: fedsim drives training_step (fast); trainer: every local update is a "
        "pl.Trainer fit (loggers and every Trainer feature; costs more per client: BENCHMARKS.md)")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    batchnorm: Literal["averaged", "personal", "batch_stats"] | None = Field(
        None, description="BatchNorm: running statistics kept and shared like other weights (averaged), every BN "
        "layer kept on the client (personal, FedBN), or batch statistics only, track_running_stats=False (batch_stats, "
        "the FedBABU authors' 4-conv and MobileNet); null: the algorithm's default (averaged except fedbn)")
    init_from: str | None = Field(None, description="a finished run folder: start from its final global weights "
                                  "(its model.npz), e.g. LG-FedAvg from a FedAvg run as the FedBABU authors do")


class OptimConfig(_Section):
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.01, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (ignored by adam)")
    weight_decay: float = Field(0.0, ge=0, description="neither the FedPer nor the FedBABU paper uses it")
    schedule: Literal["constant", "step"] = Field("constant", description="constant (FedPer paper) or x gamma at "
                                                  "each milestone (FedBABU's code: x0.1 at 1/2 and 3/4 of the rounds)")
    milestones: list[float] = Field([0.5, 0.75], description="step schedule: fractions of train.rounds")
    gamma: float = Field(0.1, gt=0, description="step schedule: factor at each milestone")

    def lr_at(self, round_idx: int, rounds: int) -> float:
        """The learning rate of round ``round_idx`` (1-based) of ``rounds``. As FedBABU's main_fed.py: the
        rate drops once round_idx - 1 >= floor(milestone * rounds)."""
        if self.schedule == "constant":
            return self.lr
        return self.lr * self.gamma ** self._drops(round_idx, rounds)

    def scale_at(self, round_idx: int, rounds: int) -> float:
        """The schedule's factor in round ``round_idx``: what it multiplies a module's own learning rates by."""
        return 1.0 if self.schedule == "constant" else self.gamma ** self._drops(round_idx, rounds)

    def _drops(self, round_idx: int, rounds: int) -> int:
        return sum(round_idx - 1 >= math.floor(m * rounds) for m in self.milestones)


class TrainConfig(_Section):
    rounds: int = Field(10, ge=1)
    local_epochs: int = Field(4, ge=1)
    batch_size: int = Field(50, ge=1)
    fraction: float = Field(1.0, gt=0, le=1, description="f: share of clients sampled each round")
    eval_every: int = Field(1, ge=1)
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="aggregation weights: n_j / sum n (FedPer's Algorithm 1) or uniform (FedBABU's code)")
    on_nonfinite: Literal["stop", "drop"] = Field("stop", description="a NaN/Inf loss stops the run, or drops that update")
    body: OptimConfig = OptimConfig()
    head: OptimConfig = OptimConfig()


class EvalConfig(_Section):
    personalize: Literal["finetune", "own_update"] = Field(
        "finetune", description="personalized accuracy after: finetune (the eval.finetune_* settings) or own_update: "
        "the method's own local update (its client hook at train's settings and the round's lr) on the evaluated "
        "copy, never kept -- how FedRep's authors score FedRep")
    finetune_epochs: int = Field(5, ge=0, description="tau_f: personalized accuracy after this many fine-tune epochs; 0 = initial only")
    finetune_part: Literal["full", "body", "head"] = "full"
    finetune_lr: float | None = Field(None, ge=0, description="null: each part's training lr at that round "
                                      "(FedBABU: the final lr, 1e-3 after decay)")
    finetune_momentum: float = Field(0.9, ge=0, lt=1)
    finetune_weight_decay: float = Field(0.0, ge=0)
    finetune_batch_size: int | None = Field(None, ge=1, description="null: train.batch_size")
    clients: int | float | None = Field(
        None, gt=0, description="evaluation cohort: a count (an integer) or a fraction (a number with a point, "
        "at most 1.0) of the clients, drawn once from the seed and scored every evaluation round; null: all. "
        "Every client is scored at the final round")
    full_every: int | None = Field(None, ge=1, description="with a cohort, also score every client each this many rounds")
    unseen: int | float | None = Field(
        None, gt=0, description="clients held out of training (a count, or a fraction with a point), drawn once "
        "from the seed: never sampled, scored every evaluation round (personalized after fine-tuning, as FedBABU's "
        "and FederatedScope's generalization protocol); summary.json reports them apart from the others")

    @property
    def personalizes(self) -> bool:
        """Whether evaluation reports a personalized accuracy beside the initial one."""
        return self.personalize == "own_update" or self.finetune_epochs > 0

    @model_validator(mode="after")
    def _finetune_settings_only_when_fine_tuning(self) -> "EvalConfig":
        # Compared with the defaults, not with what was written: a stored config.yaml spells every field out.
        if self.personalize == "own_update":
            for name, field in type(self).model_fields.items():
                if name.startswith("finetune_") and getattr(self, name) != field.default:
                    raise ValueError(f"eval.{name}: not used with eval.personalize: own_update (the method's own "
                                     "update runs at train's settings); leave it out, or set eval.personalize: finetune")
        return self

    @model_validator(mode="after")
    def _fraction_at_most_one(self) -> "EvalConfig":
        for key in ("clients", "unseen"):
            value = getattr(self, key)
            if isinstance(value, float) and value > 1:
                raise ValueError(f"eval.{key}: a fraction must be at most 1.0, got {value}; give a count as an integer")
        return self


class EngineConfig(_Section):
    workers: int = Field(2, ge=1)
    cpus_per_worker: float = Field(1.0, ge=0)
    gpus_per_worker: float = Field(0.0, ge=0, le=1)
    threads_per_worker: int = Field(1, ge=1, description="torch threads per worker; fixed so results do not depend on workers")
    round_timeout_s: float = Field(3600.0, gt=0, description="a round taking longer fails instead of hanging silently")
    heartbeat_timeout_s: float = Field(60.0, gt=0, description="a worker not answering a ping this long during a "
                                       "round (frozen, or its machine gone) is replaced and the round redone")
    max_recoveries: int = Field(3, ge=0, description="worker losses in a row (no round completing in between) "
                                "before the run stops with an error naming the worker")
    checkpoint_every: int = Field(1, ge=0, description="rounds between checkpoints (0 = never); also the rollback unit on worker loss")
    full_checkpoint_every: int = Field(10, ge=1, description="every this many checkpoints one holds all per-client "
                                       "state; the others only the clients changed since the previous one")
    state_ram_mb: float = Field(1024.0, ge=0, description="RAM per worker for per-client state (personal parts, "
                                "Ditto/SCAFFOLD slots); past it, state goes to memory-mapped files in engine.spill_dir")
    spill_dir: str | None = Field(None, description="local-disk folder for per-client state past engine.state_ram_mb "
                                  "(each worker makes its own folder inside, removed at exit); default: the system's "
                                  "temp dir - set it when that is a RAM disk (tmpfs)")
    memory_format: Literal["auto", "channels_last", "contiguous"] = Field(
        "auto", description="image tensor layout; auto = channels_last on CPU (conv steps measured 1.7x faster "
        "there, benchmarks/profiling.py compute), contiguous on GPU")
    wait_for_resources_s: float = Field(600.0, ge=0, description="on a cluster: how long to wait for the autoscaler "
                                        "to add nodes for the workers (a local run fails at once when it is short)")
    dashboard: bool = Field(False, description="start Ray's dashboard (bound to 127.0.0.1) for local runs")
    pack: int | Literal["auto"] = Field(1, description="clients a worker trains at once as one batched computation "
                                        "(1: one after another; auto: sized by measuring the worker's device); any "
                                        "size >= 2 gives the same results (docs/packed.md)")

    @field_validator("pack")
    @classmethod
    def _pack_size(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:
            raise ValueError(f"{value} is not a pack size; give 1 (off), a number of clients >= 2, or auto")
        return value

    @model_validator(mode="after")
    def _packed_on_one_thread(self) -> EngineConfig:
        # Measured (MobileNet-v1, 2 threads): a multi-threaded CPU kernel splits its sums by the size of the pack, so a
        # client's result would depend on its pack-mates, and with them on the number of workers.
        if self.pack != 1 and self.threads_per_worker > 1 and not self.gpus_per_worker:
            raise ValueError(f"engine.pack: packed training on a CPU needs engine.threads_per_worker: 1 (it is "
                             f"{self.threads_per_worker}); run more workers instead, or set engine.pack: 1")
        return self


class WandbConfig(_Section):
    mode: Literal["disabled", "offline", "online"] = "disabled"
    project: str = "fedsim"
    entity: str | None = None
    group: str | None = Field(None, description="W&B group; default: the run's name without its seed (the seeds of a "
                              "sweep variant share it, so W&B averages seeds, never methods)")
    tags: list[str] = Field(default_factory=list)
    run_id: str | None = Field(None, description="W&B run id; set to continue the same W&B run on --resume")
    per_client_limit: int = Field(100, ge=0, description="clients logged as their own curve (all go into the final table)")
    x_axis: Literal["round", "sim_time"] = Field("round", description="the charts' x-axis: the round, or simulated "
                                                  "seconds on the virtual clock (needs system.devices)")


class DevicesConfig(_Section):
    """Each client's device: a preset drawn from the seed, or a CSV trace (``client,speed,up_mbps,down_mbps`` and
    an optional ``class`` column; one row per client)."""
    preset: Literal["uniform", "lognormal", "mobile"] = Field(
        "uniform", description="uniform: every device the median one; lognormal: speed and bandwidths spread by "
        "sigma (classes slow/medium/fast by speed tercile); mobile: a stylized mix of high-end (25%, 4x), "
        "mid-range (50%, 1x) and low-end (25%, 0.25x) devices")
    trace: str | None = Field(None, description="CSV file of per-client devices (replaces the preset)")
    speed: float = Field(100.0, gt=0, description="samples per second (forward and backward) of the median device")
    up_mbps: float = Field(5.0, gt=0, description="upload bandwidth of the median device, megabits per second")
    down_mbps: float = Field(20.0, gt=0, description="download bandwidth of the median device, megabits per second")
    sigma: float = Field(0.5, ge=0, description="lognormal: standard deviation of log speed and log bandwidth")


class AvailabilityConfig(_Section):
    pattern: Literal["always", "diurnal", "trace"] = Field(
        "always", description="diurnal: each client is on for on_fraction of every period_s, at a phase drawn from "
        "the seed; trace: the intervals of a CSV file (client,start_s,end_s), repeated every period_s")
    period_s: float = Field(86400.0, gt=0, description="length of the availability cycle in simulated seconds")
    on_fraction: float = Field(0.5, gt=0, le=1, description="diurnal: share of each period a client can be selected")
    trace: str | None = Field(None, description="pattern trace: CSV file of availability intervals")

    @model_validator(mode="after")
    def _trace_with_its_file(self) -> "AvailabilityConfig":
        if (self.pattern == "trace") != (self.trace is not None):
            raise ValueError("system.availability: pattern trace and a trace file go together; set both "
                             "(pattern: trace, trace: FILE.csv) or neither")
        return self


class SystemConfig(_Section):
    """System heterogeneity on a virtual clock. Off (devices null) by default: an ideal federation where every
    sampled client reports and rounds take no simulated time."""
    devices: DevicesConfig | None = Field(None, description="null: no clock; else each client's compute speed and "
                                          "bandwidth, which give its simulated time per round")
    availability: AvailabilityConfig = AvailabilityConfig()
    dropout: float = Field(0.0, ge=0, lt=1, description="probability that a selected client drops out mid-round")
    deadline_s: float | None = Field(None, gt=0, description="a round closes this many simulated seconds after it "
                                     "starts; later reports are discarded (null: it waits for every reporting client)")
    over_selection: float = Field(0.0, ge=0, le=10, description="select this share more clients than "
                                  "max(1, round(f x N)); the round closes once that many have reported")
    target_accuracy: list[float] = Field(default_factory=list, description="mean accuracies (0-1) whose first "
                                         "simulated time summary.json reports as time_to_accuracy")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: rounds of selected clients; async: FedBuff's buffered asynchronous aggregation "
        "(clients train at once against the model they received; every async_buffer reports the server steps)")
    async_buffer: int = Field(10, ge=1, description="async: reports per server step (FedBuff's K)")
    concurrency: int | None = Field(None, ge=1, description="async: clients training at once (null: max(1, round(f x "
                                    "N)), the sync cohort)")
    server_lr: float = Field(1.0, gt=0, description="async: the server's step size on the buffered mean update")
    staleness_exponent: float = Field(0.5, ge=0, description="async: an update s server steps stale weighs "
                                      "(1 + s)^-exponent (FedBuff: 0.5, i.e. 1/sqrt(1 + s); 0: unweighted)")

    @model_validator(mode="after")
    def _a_clock_for_timed_settings(self) -> "SystemConfig":
        if self.devices is None:
            timed = {"availability": self.availability.pattern != "always", "dropout": self.dropout > 0,
                     "deadline_s": self.deadline_s is not None, "over_selection": self.over_selection > 0,
                     "target_accuracy": bool(self.target_accuracy)}
            for key, used in timed.items():
                if used:
                    raise ValueError(f"system.{key}: needs the virtual clock; set system.devices (e.g. "
                                     "system.devices.preset=uniform)")
        if self.mode == "async":
            for key, used in {"devices": self.devices is None, "deadline_s": self.deadline_s is not None,
                              "over_selection": self.over_selection > 0}.items():
                if used:
                    fix = "set system.devices (the virtual clock)" if key == "devices" else "leave it unset"
                    raise ValueError(f"system.{key}: {'needed' if key == 'devices' else 'a sync round setting'} "
                                     f"with system.mode=async; {fix}")
        if any(not 0 < target <= 1 for target in self.target_accuracy):
            raise ValueError("system.target_accuracy: give accuracies between 0 and 1 (e.g. [0.5, 0.7])")
        return self


class ServerConfig(_Section):
    """How the server combines a round's replies, for any method of the FedAvg family (its server hook gets the
    rule's values where it would get the weighted means). Any rule but mean has the server see every reply."""
    aggregator: Literal["mean", "median", "trimmed_mean", "krum"] = Field(
        "mean", description="mean: the exact weighted mean (summed on the workers); median / trimmed_mean: per "
        "coordinate (Yin et al. 2018); krum: the reply closest to its neighbours, or the mean of krum_select of them "
        "(Multi-Krum, Blanchard et al. 2017). Robust rules weigh clients equally")
    trim_fraction: float = Field(0.1, ge=0, lt=0.5, description="trimmed_mean: the share of largest and of smallest "
                                 "values dropped per coordinate (beta)")
    byzantine: int = Field(1, ge=0, description="krum: the faulty clients tolerated (f); needs more than 2f + 2 "
                           "replies a round")
    krum_select: int = Field(1, ge=1, description="krum: replies averaged (Multi-Krum's m; 1 is Krum)")


class LoggingConfig(_Section):
    wandb: WandbConfig = WandbConfig()


class Distribution(_Section):
    """A sweep value drawn at random, as Ray Tune's search spaces: exactly one of ``uniform: [lo, hi]``,
    ``loguniform: [lo, hi]``, ``randint: [lo, hi]`` (hi excluded) or ``choice: [a, b, ...]``."""
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "Distribution":
        given = [name for name in DISTRIBUTIONS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(DISTRIBUTIONS)} (got {', '.join(given) or 'none'})")
        kind, bounds = given[0], getattr(self, given[0])
        if kind == "choice" and not bounds:
            raise ValueError("choice: give at least one value")
        if kind != "choice" and not bounds[0] < bounds[1]:
            raise ValueError(f"{kind}: [lo, hi] needs lo < hi (got {list(bounds)})")
        if kind == "loguniform" and bounds[0] <= 0:
            raise ValueError(f"loguniform: lo must be above 0 (got {bounds[0]})")
        return self

    @property
    def kind(self) -> str:
        return next(name for name in DISTRIBUTIONS if getattr(self, name) is not None)

    def draw(self, rng) -> Any:
        """One value from ``rng`` (a numpy Generator); floats kept to 6 significant digits, so the value a run
        trains with is the one its name shows."""
        kind, bounds = self.kind, getattr(self, self.kind)
        if kind == "choice":
            return bounds[int(rng.integers(len(bounds)))]
        if kind == "randint":
            return int(rng.integers(bounds[0], bounds[1]))
        value = (math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1]))) if kind == "loguniform"
                 else rng.uniform(bounds[0], bounds[1]))
        return float(f"{value:.6g}")


DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")


class SearchConfig(_Section):
    """How ``fedsim sweep`` searches ``sweep:``: how many random samples, and Ray Tune's scheduler."""
    samples: int = Field(1, ge=1, description="Tune's num_samples: the grid crossed with this many draws of the "
                         "sweep's distributions (each draw shared by the grid's seeds and methods: a paired comparison)")
    scheduler: Literal["fifo", "asha"] = Field("fifo", description="fifo: every trial runs to the end; asha: Tune's "
                                               "ASHA stops trials whose search.metric trails at a milestone round")
    metric: str | None = Field(None, description="per-round metric ASHA compares, e.g. fairness/acc_p10 (the names "
                               "are W&B's; `fedsim sweep --dry-run` lists them)")
    mode: Literal["max", "min"] = "max"
    grace_rounds: int = Field(1, ge=1, description="ASHA: no trial is stopped before this round")
    reduction_factor: float = Field(3.0, gt=1, description="ASHA: keep 1/reduction_factor of the trials at each milestone")


class AlgorithmConfig(BaseModel):
    """``algorithm: fedprox`` or ``algorithm: {name: fedprox, mu: 0.01}``; the method's own parameters are
    validated by its ``Params`` (see ``fedsim algorithms``)."""
    model_config = ConfigDict(extra="allow")
    name: str = "fedper"

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# Keys that moved into a method's own parameters: old key -> where it lives now.
MOVED_KEYS = {("train", "mu"): "algorithm: {name: fedprox, mu: ...}",
              ("train", "ditto_lambda"): "algorithm: {name: ditto, lambda: ...}",
              ("train", "head_epochs"): "algorithm: {name: fedrep or fedper_ft, head_epochs: ...}"}


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # one folder name, and a valid W&B artifact name


URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters at least: "C:" stays a Windows drive
STORE_SCHEMES = ("s3", "gs", "gcs", "hdfs")  # what pyarrow.fs reaches (fedsim.storage)


class RunConfig(_Section):
    name: str = Field("run", description="the run's folder under out_dir: letters, digits, '.', '_', '-'")
    seed: int = Field(0, ge=0, lt=2**63, description="every random choice derives from it")
    algorithm: AlgorithmConfig = AlgorithmConfig()
    out_dir: str = "runs"
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    engine: EngineConfig = EngineConfig()
    system: SystemConfig = SystemConfig()
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    sweep: dict[str, list[Any] | Distribution] = Field(
        default_factory=dict, description="dotted key -> a list of values (a grid: one run per combination) or a "
        "distribution ({uniform|loguniform|randint: [lo, hi]} or {choice: [...]}, drawn search.samples times)")
    search: SearchConfig = SearchConfig()

    @field_validator("sweep", mode="before")
    @classmethod
    def _values_or_distributions(cls, sweep: Any) -> Any:
        if not isinstance(sweep, dict):
            return sweep
        checked = {}
        for key, values in sweep.items():
            if isinstance(values, dict):
                try:
                    values = Distribution.model_validate(values)
                except ValidationError as err:
                    raise ValueError(f"sweep.{key}: {_format_error(err)}") from None
            elif not isinstance(values, list):
                raise ValueError(f"sweep.{key}: give a list of values or a distribution ({{uniform: [lo, hi]}}, "
                                 f"{{loguniform: [lo, hi]}}, {{randint: [lo, hi]}}, {{choice: [...]}}), got {values!r}")
            checked[key] = values
        return checked

    @field_validator("name")
    @classmethod
    def _one_safe_folder_name(cls, name: str) -> str:
        # Checked before anything runs: a path-like name would write (and with --overwrite delete) outside
        # out_dir, and a space breaks the W&B artifact only after training.
        if not RUN_NAME.fullmatch(name):
            raise ValueError("must be one folder name of at most 128 letters, digits, '.', '_' or '-', starting "
                             "with a letter or digit (no '/', '..' or spaces); rename the run")
        return name

    @field_validator("out_dir")
    @classmethod
    def _a_folder_or_a_store(cls, out_dir: str) -> str:
        """``file://`` is a path; any other scheme must be a store fedsim reaches and name a bucket, so a mistyped
        URI never becomes a local folder called ``s3:`` (a one-line error instead)."""
        if out_dir.startswith("file://"):
            return out_dir[len("file://"):] or "/"
        scheme = URI_SCHEME.match(out_dir)
        if scheme is None:
            return out_dir
        name = scheme.group(1).lower()
        if name not in STORE_SCHEMES:
            raise ValueError(f"{out_dir!r} names the {name}:// scheme; give a folder, file://PATH, or one of "
                             f"{', '.join(f'{s}://BUCKET/prefix' for s in STORE_SCHEMES)}")
        if not out_dir.startswith(f"{scheme.group(1)}://") or not out_dir.split("://", 1)[1].split("/")[0]:
            raise ValueError(f"{out_dir!r} names no bucket; give {name}://BUCKET/prefix")
        return out_dir

    @model_validator(mode="after")
    def _check_cross_fields(self) -> "RunConfig":
        from fedsim.algorithms import algorithm_class

        method = algorithm_class(self.algorithm.name)
        try:
            params = method.Params.model_validate(self.algorithm.params)
        except ValidationError as err:
            raise ValueError(f"{self.algorithm.name}: {_format_error(err, prefix='algorithm')}") from None
        # Stored with defaults filled in, so config.yaml and checkpoints say exactly what ran.
        self.algorithm.__pydantic_extra__ = params.model_dump(by_alias=True)
        if self.server.aggregator != "mean" and method.aggregation == "replies":
            raise ValueError(f"server.aggregator: {self.algorithm.name} combines its clients' replies itself; robust "
                             "rules replace the mean of the FedAvg family's methods; leave server.aggregator: mean")
        if self.logging.wandb.x_axis == "sim_time" and self.system.devices is None:
            raise ValueError("logging.wandb.x_axis: sim_time needs the virtual clock; set system.devices (e.g. "
                             "system.devices.preset=uniform) or x_axis=round")
        return self


# -- which settings change what a run computes ----------------------------------------------------
# Where a run writes, how it logs and its sweep never change its results; of the engine settings only these
# do (they change floating-point results in the last bits). Everything else does.
NOT_RESULTS = ("name", "out_dir", "sweep", "search", "logging")
ENGINE_RESULTS = ("threads_per_worker", "memory_format")


def result_settings(cfg_dict: dict) -> dict:
    """The settings of a resolved config (``RunConfig.model_dump()``) that change what the run computes."""
    settings = {k: v for k, v in cfg_dict.items() if k not in NOT_RESULTS}
    settings["engine"] = {k: v for k, v in settings["engine"].items() if k in ENGINE_RESULTS}
    # Packed training changes the last bits (other kernels); its pack size never does (docs/packed.md).
    settings["engine"]["packed"] = cfg_dict["engine"].get("pack", 1) != 1
    return settings


# data.partition settings added after the flat keys, (kind, name) -> default: at it, a fingerprint stays as it was.
LATER_PARTITION_DEFAULTS = {("conflicting", "agreed"): 0.0}


def _flat_partition(data: dict) -> dict:
    """The data section as fedsim wrote it before partitions were typed (its flat keys at their old defaults
    where another kind's), so that checkpoints written then keep their fingerprint."""
    partition = data["partition"]
    flat = {k: v for k, v in data.items() if k != "partition"} | {"partition": partition["name"]}
    for key, (kind, name, default) in FLAT_PARTITION_KEYS.items():
        flat[key] = partition[name] if partition["name"] == kind else default
    for (kind, name), default in LATER_PARTITION_DEFAULTS.items():
        if partition["name"] == kind and partition.get(name, default) != default:
            flat[f"partition.{name}"] = partition[name]  # flattened as data.partition.NAME in changed_settings
    return flat


# model.* keys added after checkpoints were first written: at their defaults they leave a fingerprint as it was.
SYSTEM_OFF = SystemConfig().model_dump()
SERVER_MEAN = ServerConfig().model_dump()
LATER_EVAL_DEFAULTS = {"unseen": None, "personalize": "finetune"}  # eval.* keys added later: at their defaults, a fingerprint stays as it was
LATER_MODEL_DEFAULTS = {"client_args": {}, "head": None, "callbacks": [], "precision": "32", "client_loop": "fabric"}


def _resume_settings(cfg_dict: dict) -> dict:
    """``result_settings`` less what a resume may change: a resumed run may be extended (train.rounds),
    unless a step schedule places its milestones by the round count."""
    settings = result_settings(cfg_dict)
    settings["data"] = _flat_partition(settings["data"])
    settings["model"] = {k: v for k, v in settings["model"].items() if LATER_MODEL_DEFAULTS.get(k, ...) != v}
    settings["eval"] = {k: v for k, v in settings["eval"].items() if LATER_EVAL_DEFAULTS.get(k, ...) != v}
    if not settings["engine"]["packed"]:  # added later: an unpacked run keeps the fingerprint it had
        del settings["engine"]["packed"]
    if settings["system"] == SYSTEM_OFF:  # added later: an ideal federation keeps the fingerprint it had
        del settings["system"]
    if settings.get("server") == SERVER_MEAN:  # added later: the exact mean keeps the fingerprint it had
        del settings["server"]
    stepped = any(settings["train"][part]["schedule"] != "constant" for part in ("body", "head"))
    settings["train"] = {k: v for k, v in settings["train"].items() if k != "rounds" or stepped}
    return settings


def resume_fingerprint(cfg_dict: dict) -> str:
    """What a checkpoint must match to continue this run."""
    return hashlib.sha256(json.dumps(_resume_settings(cfg_dict), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_settings(before: dict, after: dict) -> list[str]:
    """Dotted keys a resume may not change whose values differ between two resolved configs."""
    old, new = _flatten(_resume_settings(before)), _flatten(_resume_settings(after))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        if key in ("algorithm", "partition") and isinstance(node.get(key), str):  # `algorithm: fedprox` + `algorithm.mu=0.1`
            node[key] = {"name": node[key]}
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {key} is not a section; check the key")
    node[leaf] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["train.rounds=3", "algorithm=fedavg"]`` -> nested dict (values parsed as YAML scalars)."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r}: expected key=value, e.g. train.rounds=3")
        try:
            value = strict_yaml.load(raw)
        except strict_yaml.YamlError as err:
            raise ConfigError(f"override {key.strip()}: {err}") from None
        key = key.strip()
        if key.startswith("sweep.") and len(key) > len("sweep."):  # a sweep's keys are dotted settings themselves
            tree.setdefault("sweep", {})[key[len("sweep."):]] = value
        else:
            set_dotted(tree, key, value)
    return tree


def merge_trees(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge_trees(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 40
_SHORT.maxlist = _SHORT.maxdict = 3
_SHORT.maxlevel = 1


def _format_error(err: ValidationError, prefix: str = "") -> str:
    first = err.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    if re.match(r"^[\w.]+: ", message):
        return message  # a validator's own message, which names its field
    where = ".".join(str(p) for p in ((prefix,) if prefix else ()) + tuple(first["loc"]))
    if where:
        got = _SHORT.repr(first.get("input"))  # short: the input may be huge (a whole section, an alias expansion)
        return f"{where}: {message} (got {got})"
    return f"config: {message}"


def _refuse_moved_keys(tree: dict[str, Any]) -> None:
    for (section, key), now in MOVED_KEYS.items():
        if isinstance(tree.get(section), dict) and key in tree[section]:
            raise ConfigError(f"{section}.{key}: moved to the method's own parameters; write {now}")


def validate(tree: dict[str, Any]) -> RunConfig:
    _refuse_moved_keys(tree)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


RUN_SECTIONS = {"algorithm", "data", "model", "train", "eval", "sweep"}  # what a config sets to describe a run


def refuse_defaults_only(path: str | Path, tree: dict[str, Any]) -> None:
    """A valid config that sets none of the sections describing a run would train every default (a whole
    CIFAR-10 run): most likely the wrong file. Checked after validation, so a bad value is named first."""
    if not tree.keys() & RUN_SECTIONS:
        raise ConfigError(f"{path}: sets none of {', '.join(sorted(RUN_SECTIONS))}, so it would run every default "
                          "(a whole CIFAR-10 training); name at least the data and the method")


def load_tree(path: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; pass the path of a YAML file such as experiments/quickstart.yaml")
    try:
        tree = strict_yaml.load(path.read_text())
    except strict_yaml.YamlError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}); fix the syntax") from None
    if tree is None:
        raise ConfigError(f"{path}: the file is empty; a config names at least its data and method (start from "
                          "experiments/quickstart.yaml)")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (data:, model:, train:, ...)")
    tree.setdefault("name", path.stem)
    if isinstance(tree.get("algorithm"), str):  # so that `algorithm.mu=...` overrides keep the name
        tree["algorithm"] = {"name": tree["algorithm"]}
    return merge_trees(tree, parse_overrides(list(overrides)))


def _label(value: Any) -> str:
    """A sweep value in a run name: an algorithm given as a mapping is named by its name."""
    return str(value["name"]) if isinstance(value, dict) and "name" in value else str(value)


SWEEP_STREAM = 0x5EE9  # the sweep's draws: a stream of their own, apart from every random choice of a run


def expand_sweep(tree: dict[str, Any]) -> list[RunConfig]:
    """One validated config per run of the sweep: every combination of the listed values (the grid), crossed
    with ``search.samples`` draws of the distributions, each with its own run name (its values in order)."""
    base = validate(tree)  # validate once as written so errors name the user's keys
    if not base.sweep:
        return [base]
    grid = {k: v for k, v in base.sweep.items() if isinstance(v, list)}
    drawn = {k: v for k, v in base.sweep.items() if isinstance(v, Distribution)}
    _refuse_empty_search(grid, drawn, base.search.samples)
    runs = []
    for sample in range(base.search.samples if drawn else 1):
        rng = np.random.default_rng([base.seed, SWEEP_STREAM, sample])
        draws = {key: dist.draw(rng) for key, dist in drawn.items()}
        for values in itertools.product(*grid.values()):
            chosen = {**dict(zip(grid, values)), **draws}
            runs.append(_variant(tree, base, [(key, chosen[key]) for key in base.sweep]))
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ConfigError(f"search.samples: two draws gave the same values ({twice}); widen the distributions or "
                          "lower search.samples")
    return runs


def _refuse_empty_search(grid: dict[str, list], drawn: dict[str, Distribution], samples: int) -> None:
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"sweep.{key}: an empty list gives no runs; list at least one value, or remove the key")
    if samples > 1 and not drawn:
        raise ConfigError(f"search.samples: {samples} samples of a sweep without distributions would repeat the same "
                          "runs (a run is deterministic); add a distribution ({uniform: [lo, hi]}, ...) or list seeds "
                          "under sweep.seed")


def _variant(tree: dict[str, Any], base: RunConfig, chosen: list[tuple[str, Any]]) -> RunConfig:
    variant = {k: v for k, v in tree.items() if k not in ("sweep", "search")}
    for key, value in chosen:
        set_dotted(variant, key, value)
    labels = [(key, re.sub(r"[^A-Za-z0-9_.-]+", "_", _label(value))) for key, value in chosen]
    variant["name"] = "-".join([base.name, *(label for _, label in labels)])
    if base.logging.wandb.group is None:  # a variant's seeds form one W&B group (averaged there), methods never
        set_dotted(variant, "logging.wandb.group", "-".join([base.name, *(label for key, label in labels if key != "seed")]))
    try:
        return validate(variant)
    except ConfigError as err:
        raise ConfigError(f"sweep: {err} (in the run {variant['name']})") from None
