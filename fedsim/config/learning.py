"""The sections that say what a run learns and how it is scored: its data (their partition among clients is
``partition``'s), the model, local training with its optimizers and schedule, the server's aggregation rule, and
evaluation."""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from fedsim.config.base import Section, format_error
from fedsim.config.partition import FLAT_PARTITION_KEYS, ClassesPartition, PartitionSettings, typed_partition


# Lightning precisions fedsim trains and scores with (model.precision).
Precision = Literal["32", "32-true", "16-mixed", "bf16-mixed"]

class DataConfig(Section):
    counted_by_the_work_estimate = frozenset({"num_clients"})
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
    test_split: float | None = Field(None, gt=0, lt=1, description="for data without a test set of its own (an "
                                     "image folder of <class>/ folders alone): this share of each class's images, "
                                     "drawn from the seed, is the test set; null: the data's own test set")
    augment: bool = Field(True, description="random crop + horizontal flip during local training")
    validation: float = Field(0.0, ge=0, lt=1, description="fraction of each client's training data held out as its "
                              "validation split (per class, from the seed), scored beside test; what selects a round "
                              "reads it. 0 = none")

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
            return typed_partition(value)
        except ValidationError as err:
            raise ValueError(format_error(err, prefix="data.partition")) from None


def callback_path(path: str) -> str:
    """A callback's class as fedsim's plug-ins name it: ``package.module:Class``, from that or from the Lightning CLI's
    ``package.module.Class``."""
    if ":" in path:
        return path
    module, _, name = path.rpartition(".")
    if not module or not name:
        raise ValueError(f"{path!r}: give the callback's class as 'package.module:Class' or 'package.module.Class'")
    return f"{module}:{name}"


class CallbackSpec(Section):
    """A callback as Lightning's CLI names one."""
    class_path: str = Field(description="'package.module:Class' (or Lightning's 'package.module.Class') of a "
                            "pytorch_lightning Callback")
    init_args: dict[str, Any] = Field({}, description="keyword arguments of its __init__")

    @field_validator("class_path")
    @classmethod
    def _colon_form(cls, path: str) -> str:
        return callback_path(path)


class PartsConfig(Section):
    """``model.parts``: the body/head split by state-dict name patterns (fnmatch: ``*`` also crosses dots), for a
    split no block index gives, such as LoRA's A matrices in the body and its B matrices with the classifier in the
    head. Every pattern must name a tensor and every tensor that travels must be named exactly once."""
    body: list[str] = Field(description="patterns of the body: shared under FedPer, trained under FedBABU")
    head: list[str] = Field(description="patterns of the head: personal under FedPer, fixed under FedBABU")


PERSONAL_LAYERS_DEFAULT = 1


class ModelConfig(Section):
    name: str = Field("cnn4", description="a registered model or a user's 'package.module:function'")
    personal_layers: int = Field(PERSONAL_LAYERS_DEFAULT, ge=0, description="K_P: classifier + the last K_P-1 blocks are personal")
    options: dict[str, Any] = Field({}, description="settings of a registered model that takes them: char_lstm "
                                    "{embedding, hidden, layers}, char_transformer {width, heads, layers} (left out: "
                                    "LEAF's sizes, docs/shakespeare.md); minilm {r, alpha, dropout, target_modules} "
                                    "(docs/minilm.md)")
    client: str | None = Field(None, description="'package.module:Class' of your own LightningModule (docs/lightning.md); "
                               "null: the built-in FedClient around model.name")
    client_args: dict[str, Any] = Field({}, description="keyword arguments of model.client's __init__ (num_classes, "
                                        "in_channels, image_size come from the data when it takes them)")
    head: list[str] | None = Field(None, description="the module's submodules that form the head (personal under "
                                   "FedPer, fixed under FedBABU); null: a fedsim model's K_P, else its `head` submodule")
    parts: PartsConfig | None = Field(None, description="the body/head split by tensor name patterns, e.g. {body: "
                                      "['*lora_A*'], head: ['*lora_B*', 'classifier.*']}; null: model.head or K_P")
    callbacks: list[str | CallbackSpec] = Field([], description="Lightning callbacks for every local update: "
                                               "'package.module:Class' or {class_path: ..., init_args: {...}}")
    precision: Precision = Field(
        "32", description="Lightning precision of local training and scoring, through Fabric (16-mixed needs a GPU)")
    client_loop: Literal["fabric", "trainer"] = Field(
        "fabric", description="fabric: fedsim drives training_step (fast); trainer: every local update is a "
        "pl.Trainer fit (loggers and every Trainer feature; costs more per client: BENCHMARKS.md)")

    @field_validator("callbacks", mode="before")
    @classmethod
    def _callback_paths(cls, value: Any) -> Any:
        return [callback_path(v) if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    batchnorm: Literal["averaged", "personal", "batch_stats", "local_statistics"] | None = Field(
        None, description="BatchNorm: running statistics kept and shared like other weights (averaged), every BN "
        "layer kept on the client (personal, FedBN), or batch statistics only, track_running_stats=False (batch_stats, "
        "the FedBABU authors' 4-conv and MobileNet), or the running statistics kept on each client and the affine "
        "weights shared (local_statistics, SiloBN); null: the algorithm's default (averaged except fedbn), "
        "local_statistics in place of averaged under privacy.dp")
    init_from: str | None = Field(None, description="a finished run folder: start from its final global weights "
                                  "(its model.npz), e.g. LG-FedAvg from a FedAvg run as the FedBABU authors do")

    @model_validator(mode="after")
    def _one_split(self) -> ModelConfig:
        # Two splits of one model would leave the reader guessing which one the run used.
        if self.parts is not None and self.head is not None:
            raise ValueError("model.parts and model.head both name the head; keep one (model.parts names tensors, "
                             "model.head submodules)")
        # K_P at its default is allowed: a run folder's config.yaml writes every field, and must read back.
        if self.parts is not None and self.personal_layers != PERSONAL_LAYERS_DEFAULT:
            raise ValueError("model.parts replaces model.personal_layers; remove model.personal_layers")
        return self


class OptimConfig(Section):
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.01, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (ignored by adam)")
    weight_decay: float = Field(0.0, ge=0, description="neither the FedPer nor the FedBABU paper uses it")
    schedule: Literal["constant", "step"] = Field("constant", description="constant (FedPer paper) or x gamma at "
                                                  "each milestone (FedBABU's code: x0.1 at 1/2 and 3/4 of the rounds)")
    milestones: list[float] = Field([0.5, 0.75], description="step schedule: fractions of train.rounds")
    gamma: float = Field(0.1, gt=0, description="step schedule: factor at each milestone")

    @field_validator("milestones")
    @classmethod
    def _fractions_of_the_run(cls, milestones: list[float]) -> list[float]:
        # A negative one would drop the rate before round 1, one past 1 never: both are a round count mistaken for a
        # fraction, or a typo.
        outside = [m for m in milestones if not 0 <= m <= 1]
        if outside:
            raise ValueError(f"{outside[0]:g} is not a fraction of train.rounds; give milestones between 0 and 1 "
                             "(e.g. [0.5, 0.75])")
        return milestones

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


class TrainConfig(Section):
    counted_by_the_work_estimate = frozenset({"rounds", "local_epochs"})
    rounds: int = Field(10, ge=1)
    local_epochs: int = Field(4, ge=1)
    batch_size: int = Field(50, ge=1)
    fraction: float = Field(1.0, gt=0, le=1, description="f: share of clients sampled each round")
    sampling: Literal["fixed", "poisson"] = Field(
        "fixed", description="fixed: round(f x N) clients drawn without replacement each round; poisson: each client "
        "joins each round with probability f, independently (what DP accountants assume for amplification)")
    eval_every: int = Field(1, ge=1)
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="aggregation weights: n_j / sum n (FedPer's Algorithm 1) or uniform (FedBABU's code)")
    on_nonfinite: Literal["stop", "drop"] = Field("stop", description="a NaN/Inf loss stops the run, or drops that update")
    body: OptimConfig = OptimConfig()
    head: OptimConfig = OptimConfig()


class EvalConfig(Section):
    counted_by_the_work_estimate = frozenset({"finetune_epochs"})
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

    def held_out(self, num_clients: int) -> int:
        """How many of ``num_clients`` clients eval.unseen holds out of training (0 when unset)."""
        unseen = self.unseen
        return 0 if unseen is None else unseen if isinstance(unseen, int) else round(unseen * num_clients)

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


class ServerConfig(Section):
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
