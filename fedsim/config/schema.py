"""The whole run configuration, :class:`RunConfig`: every section of a run's file, the method named by
``algorithm`` (whose own parameters its class validates: :func:`fedsim.config.checks.check_sections`), and the
``sweep`` / ``search`` sections that ``fedsim sweep`` expands (:mod:`fedsim.sweep.expand`)."""
from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedsim.config.base import Section, format_error
from fedsim.config.execution import EngineConfig, LoggingConfig, SystemConfig
from fedsim.config.learning import DataConfig, EvalConfig, ModelConfig, ServerConfig, TrainConfig
from fedsim.config.privacy import PrivacyConfig


class Distribution(Section):
    """A sweep value drawn at random, as Ray Tune's search spaces: exactly one of ``uniform: [lo, hi]``,
    ``loguniform: [lo, hi]``, ``randint: [lo, hi]`` (hi excluded) or ``choice: [a, b, ...]``."""
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Distribution:
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

    @property
    def bounds(self) -> Any:
        """``[lo, hi]`` of a range, or the values of a choice."""
        return getattr(self, self.kind)


DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")


class SearchConfig(Section):
    """How ``fedsim sweep`` searches ``sweep:``: how many random samples, and Ray Tune's scheduler."""
    samples: int = Field(1, ge=1, description="Tune's num_samples: the grid crossed with this many draws of the "
                         "sweep's distributions (each draw shared by the grid's seeds and methods: a paired comparison)")
    scheduler: Literal["fifo", "asha"] = Field("fifo", description="fifo: every trial runs to the end; asha: Tune's "
                                               "ASHA stops trials whose search.metric trails at a milestone round")
    metric: str | None = Field(None, description="per-round metric ASHA compares, e.g. fairness/acc_p10 (the names "
                               "are W&B's; `fedsim sweep --dry-run` lists them), or your module's self.log value as "
                               "NAME/STATISTIC, e.g. val_loss/mean")
    mode: Literal["max", "min"] | None = Field(None, description="whether ASHA keeps the highest or the lowest; null: "
                                               "the metric's own direction (min for a loss, a std, traffic, time)")
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


# What `fedsim tune` searches for every method alike: a shorthand (lr sets train.body.lr and train.head.lr,
# momentum both parts' momentum, local_epochs train.local_epochs), or any dotted config key with its declared range
# (model.client_args.lr: a user module's own argument; eval.finetune_lr, ...), validated as each trial's run is.
SHORTHANDS = ("lr", "momentum", "local_epochs")
NOT_TUNED = ("name", "seed", "out_dir", "sweep", "search", "tune", "logging", "engine")  # no setting of what is learnt


def _default_space() -> dict[str, Distribution]:
    # lr over the decades the suites' methods train at (0.005 pFedMe ... 0.1 FedBABU); momentum: plain SGD (the
    # FedPer, pFedMe and PFLlib settings) or 0.9 (FedBABU's); local epochs: 1 (PFLlib), 5 (FedAvg's E) or 10.
    return {"lr": Distribution(loguniform=(1e-3, 0.3)), "momentum": Distribution(choice=[0.0, 0.9]),
            "local_epochs": Distribution(choice=[1, 5, 10])}


class SharedGrid(Section):
    """The shared search as a grid: each effective step lr / (1 - momentum) at each momentum (lr = step x
    (1 - momentum)), so every momentum meets the same steps and no method's choice rests on one lucky draw."""
    step: list[float] = Field(min_length=1, description="effective steps lr / (1 - momentum), each above 0")
    momentum: list[float] = Field([0.0, 0.9], min_length=1, description="momenta, each in [0, 1)")

    @field_validator("step")
    @classmethod
    def _positive_steps(cls, steps: list[float]) -> list[float]:
        if min(steps) <= 0 or max(steps) > 10 or len(set(steps)) < len(steps):
            raise ValueError(f"give distinct steps in (0, 10] (got {steps})")
        return steps

    @field_validator("momentum")
    @classmethod
    def _momenta(cls, momenta: list[float]) -> list[float]:
        if min(momenta) < 0 or max(momenta) >= 1 or len(set(momenta)) < len(momenta):
            raise ValueError(f"give distinct momenta in [0, 1) (got {momenta})")
        return momenta


class TuneConfig(Section):
    """``fedsim tune``: every method of ``methods`` searched in two stages with the same chance (``fedsim.sweep.search``):
    the shared settings at the methods' own defaults, then ``own_trials`` settings of each method's own parameters,
    chosen on validation, then run at ``final_seeds`` seeds."""
    methods: list[AlgorithmConfig] = Field(min_length=1, description="the methods compared: a name, or a mapping "
                                           "whose parameters stay fixed (not searched)")
    trials: int = Field(8, ge=1, le=10_000, description="shared settings drawn from space (the same for every "
                        "method); ignored where grid is given")
    grid: SharedGrid | None = Field(None, description="the shared stage as a grid over the effective step and the "
                                    "momentum instead of drawn trials; space may then not hold lr or momentum")
    own_trials: int = Field(2, ge=0, le=1_000, description="the second stage: settings of each method's own "
                            "parameters at its first-stage choice (a method without own parameters refines the step)")
    rounds: int | None = Field(None, ge=1, description="rounds of every search run; null: train.rounds")
    final_rounds: int | None = Field(None, ge=1, description="rounds of the chosen settings' runs; null: rounds")
    seeds: list[int] = Field([0], min_length=1, description="the seeds each trial runs at; its score is their mean")
    final_seeds: int = Field(5, ge=1, description="the chosen settings run at seeds 0..final_seeds-1 (test "
                             "accuracy's mean and 95% CI)")
    space: dict[str, Distribution] = Field(
        default_factory=_default_space, description="the shared space (lr sets train.body.lr and train.head.lr, "
        "momentum both parts' momentum, local_epochs train.local_epochs; or any dotted config key, e.g. "
        "model.client_args.lr, a module's own argument); leave a key out where the setting fixes it")

    @field_validator("space")
    @classmethod
    def _tunable_keys(cls, space: dict[str, Distribution]) -> dict[str, Distribution]:
        for key in space:
            section = key.split(".")[0]
            if key not in SHORTHANDS and ("." not in key or section in NOT_TUNED):
                close = difflib.get_close_matches(key, SHORTHANDS, n=1)
                raise ValueError(f"tune.space.{key}: not a setting tune can search; "
                                 + (f"did you mean {close[0]}? " if close else "") + f"give one of "
                                 f"{', '.join(SHORTHANDS)} or a dotted key of what a run learns with (e.g. "
                                 "model.client_args.lr, train.batch_size)")
        return space

    @model_validator(mode="after")
    def _grid_sets_lr(self) -> TuneConfig:
        taken = [key for key in ("lr", "momentum") if self.grid is not None and key in self.space]
        if taken:
            raise ValueError(f"space.{taken[0]}: the grid sets lr and momentum (lr = step x (1 - momentum)); remove "
                             f"{taken[0]} from tune.space, or the grid")
        return self

    @field_validator("methods")
    @classmethod
    def _each_method_once(cls, methods: list[AlgorithmConfig]) -> list[AlgorithmConfig]:
        names = [m.name for m in methods]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"{twice} is listed twice; list each method once (its own parameters are searched)")
        return methods

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) < len(seeds) or min(seeds) < 0:
            raise ValueError(f"give distinct seeds of at least 0 (got {seeds})")
        return seeds


# Keys that moved into a method's own parameters: old key -> where it lives now.
MOVED_KEYS = {("train", "mu"): "algorithm: {name: fedprox, mu: ...}",
              ("train", "ditto_lambda"): "algorithm: {name: ditto, lambda: ...}",
              ("train", "head_epochs"): "algorithm: {name: fedrep or fedper_ft, head_epochs: ...}"}


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # one folder name, and a valid W&B artifact name


URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")  # two letters at least: "C:" stays a Windows drive
STORE_SCHEMES = ("s3", "gs", "gcs", "hdfs")  # what pyarrow.fs reaches (fedsim.storage)


class RunConfig(Section):
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
    privacy: PrivacyConfig | None = Field(None, description="user-level differential privacy and secure "
                                          "aggregation (docs/privacy.md); null: none")
    logging: LoggingConfig = LoggingConfig()
    sweep: dict[str, list[Any] | Distribution] = Field(
        default_factory=dict, description="dotted key -> a list of values (a grid: one run per combination) or a "
        "distribution ({uniform|loguniform|randint: [lo, hi]} or {choice: [...]}, drawn search.samples times)")
    search: SearchConfig = SearchConfig()
    tune: TuneConfig | None = Field(None, description="`fedsim tune`: methods, budget and shared space")

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
                    raise ValueError(f"sweep.{key}: {format_error(err)}") from None
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
        if not out_dir.strip():
            raise ValueError("is empty, which would write the run folder into the working directory; give a folder "
                             "such as runs (or '.' for the working directory itself)")
        if any(ord(c) < 32 for c in out_dir):  # a newline would split every line that prints the path
            raise ValueError("holds a control character (a newline or a tab, say), which a folder name fedsim prints "
                             "and resumes from should not; remove it")
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

