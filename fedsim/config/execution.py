"""The sections that say how a run executes: its workers (engine), the simulated devices, availability and clock
of its federation (system), and its logging."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from fedsim.config.base import Section


# The longest wait a setting may ask for: 10^7 s, about 116 days, longer than any run waits on one thing; far below
# where a wait overflows (Ray counts milliseconds in a 64-bit integer, Python's locks threading.TIMEOUT_MAX ~ 292 years).
MAX_WAIT_S = 1e7


class EngineConfig(Section):
    backend: Literal["ray", "local"] = Field(
        "ray", description="where the server and workers run: ray (actors; parallel and cluster runs) or local (one "
        "worker in this process: no Ray start-up, and breakpoint() in a client module stops in your terminal; "
        "needs engine.workers: 1). ray stays the default, also for one worker: two workers train a round 1.86x as fast "
        "as one, which pays for Ray's ~10 s start-up from the first quickstart round, and only a worker in its own "
        "process can be stopped by engine.round_timeout_s and the heartbeat when a client hangs (BENCHMARKS.md)")
    workers: int = Field(2, ge=1)
    cpus_per_worker: float = Field(1.0, ge=0)
    gpus_per_worker: float = Field(0.0, ge=0, le=1)
    # More threads than cores only slow a worker, and no machine has 1024 cores a worker could use; past that lies
    # a crash when the worker first computes (1e9 threads: libgomp asked for 216 GB, measured).
    threads_per_worker: int = Field(1, ge=1, le=1024, description="torch threads per worker; fixed so results do "
                                    "not depend on workers")
    round_timeout_s: float = Field(3600.0, gt=0, le=MAX_WAIT_S, description="a round taking longer fails instead of "
                                   "hanging silently")
    heartbeat_timeout_s: float = Field(60.0, gt=0, le=MAX_WAIT_S, description="a worker not answering a ping this long "
                                       "during a round (frozen, or its machine gone) is replaced and the round redone")
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
    wait_for_resources_s: float = Field(600.0, ge=0, le=MAX_WAIT_S, description="on a cluster: how long to wait for "
                                        "the autoscaler to add nodes for the workers (a local run fails at once when it "
                                        "is short)")
    dashboard: bool = Field(False, description="start Ray's dashboard (bound to 127.0.0.1) for local runs")
    pack: int | Literal["auto"] = Field(1, description="clients a worker trains at once as one batched computation "
                                        "(1: one after another; auto: sized by measuring the worker's device); any "
                                        "size >= 2 gives the same results (docs/packed.md)")

    @field_validator("pack")
    @classmethod
    def _pack_size(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{value} is not a pack size; give 1 (off), a number of clients >= 2, or auto")
        return value

    @model_validator(mode="after")
    def _local_is_one_worker(self) -> EngineConfig:
        if self.backend == "local" and self.workers != 1:
            raise ValueError(f"engine.backend: local runs one worker in this process (engine.workers is "
                             f"{self.workers}); set engine.workers: 1, or engine.backend: ray for parallel workers")
        return self

    @model_validator(mode="after")
    def _packed_on_one_thread(self) -> EngineConfig:
        # Measured (MobileNet-v1, 2 threads): a multi-threaded CPU kernel splits its sums by the size of the pack, so a
        # client's result would depend on its pack-mates, and with them on the number of workers.
        if self.pack != 1 and self.threads_per_worker > 1 and not self.gpus_per_worker:
            raise ValueError(f"engine.pack: packed training on a CPU needs engine.threads_per_worker: 1 (it is "
                             f"{self.threads_per_worker}); run more workers instead, or set engine.pack: 1")
        return self


# The slowest device rate (samples/s, Mbit/s) a setting may give: slower is no device an experiment models, and near
# 0 (5e-324 passes gt=0) a round's simulated time overflows to inf.
MIN_RATE = 1e-6


class DevicesConfig(Section):
    """Each client's device: a preset drawn from the seed, or a CSV trace (``client,speed,up_mbps,down_mbps`` and
    an optional ``class`` column; one row per client)."""
    preset: Literal["uniform", "lognormal", "mobile"] = Field(
        "uniform", description="uniform: every device the median one; lognormal: speed and bandwidths spread by "
        "sigma (classes slow/medium/fast by speed tercile); mobile: a stylized mix of high-end (25%, 4x), "
        "mid-range (50%, 1x) and low-end (25%, 0.25x) devices")
    trace: str | None = Field(None, description="CSV file of per-client devices (replaces the preset)")
    speed: float = Field(100.0, ge=MIN_RATE, description="samples per second (forward and backward) of the median "
                         "device")
    up_mbps: float = Field(5.0, ge=MIN_RATE, description="upload bandwidth of the median device, megabits per second")
    down_mbps: float = Field(20.0, ge=MIN_RATE, description="download bandwidth of the median device, megabits per "
                             "second")
    # At 10 the middle 99.7% of devices already span e^60 (10^26) in speed; a few hundred overflows e^(sigma z) to
    # inf or 0, a device of no speed at all.
    sigma: float = Field(0.5, ge=0, le=10, description="lognormal: standard deviation of log speed and log bandwidth")


class AvailabilityConfig(Section):
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


class SystemConfig(Section):
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
    server_momentum: float = Field(0.0, ge=0, lt=1, description="async: momentum of the server's step, v <- m v + "
                                   "the buffered mean update, x <- x + server_lr v (FLSim's FedBuff example, "
                                   "examples/configs/sent140_fedbuff_config.json:17-20: server lr 0.7, momentum 0.9)")
    async_weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="async: each report's weight in the buffered mean: uniform (FedBuff, Nguyen et al. "
        "2022, Algorithm 1: the mean of the K updates; FLSim's example: base_equal_example_weight, "
        "sent140_fedbuff_config.json:34-37) or samples (n_j, as train.weighting: samples)")
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


class WandbConfig(Section):
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

    @field_validator("tags")
    @classmethod
    def _tags_wandb_takes(cls, tags: list[str]) -> list[str]:
        # W&B refuses them in wandb.init, after the run folder is written.
        wrong = next((tag for tag in tags if not 1 <= len(tag) <= 64), None)
        if wrong is not None:
            raise ValueError(f"{wrong[:20]!r}{'...' if len(wrong) > 20 else ''} has {len(wrong)} characters; W&B takes "
                             "tags of 1 to 64")
        return tags


class LoggingConfig(Section):
    wandb: WandbConfig = WandbConfig()
