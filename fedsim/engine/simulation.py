"""Run one configured simulation: prepare data and partition, start Ray, loop rounds, write the run folder."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import ray
import yaml
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fedsim.config import ConfigError, RunConfig
from fedsim.data import load_dataset, make_partition
from fedsim.engine.driver import DriverActor
from fedsim.metrics import summarize

RoundCallback = Callable[[dict, dict], None]


@dataclass
class RunResult:
    name: str
    run_dir: Path
    summary: dict


def connect_ray(cfg: RunConfig) -> None:
    """Attach to a cluster when RAY_ADDRESS is set, else start a local Ray sized for the workers."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    quiet = {"include_dashboard": False, "log_to_driver": True, "configure_logging": True, "logging_level": "warning"}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **quiet)
    else:
        engine = cfg.engine
        cpus = max(os.cpu_count() or 1, int(engine.workers * engine.cpus_per_worker + 0.999))
        ray.init(num_cpus=cpus, **quiet)


def check_resources(cfg: RunConfig) -> None:
    """Fail fast where Ray would otherwise wait forever for resources that do not exist."""
    engine, have = cfg.engine, ray.cluster_resources()
    workers = min(engine.workers, cfg.data.num_clients)
    for resource, each in (("GPU", engine.gpus_per_worker), ("CPU", engine.cpus_per_worker)):
        need = workers * each
        if need > have.get(resource, 0) + 1e-9:
            field = "gpus_per_worker" if resource == "GPU" else "cpus_per_worker"
            raise ConfigError(f"engine.{field}: {workers} workers x {each} need {need:g} {resource}, the Ray cluster "
                              f"has {have.get(resource, 0):g}; lower engine.workers or engine.{field}")


def prepare_run_dir(cfg: RunConfig, overwrite: bool) -> Path:
    run_dir = Path(cfg.out_dir) / cfg.name
    if run_dir.exists() and any(run_dir.iterdir()) and not overwrite:
        raise ConfigError(f"{run_dir}: run folder already exists; pass --overwrite to replace it or change name")
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "rounds.jsonl", "summary.json"):
        (run_dir / stale).unlink(missing_ok=True)
    return run_dir


def _this_node() -> NodeAffinitySchedulingStrategy:
    # The driver actor stays on the submitting node so it shares that node's view of the data folder.
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def _personalized_summary(records: list[dict]) -> dict:
    if "acc_personalized" not in records[0]:
        return {}
    final = {r["client"]: r["acc_personalized"] for r in records}
    return {"acc_personalized": summarize(list(final.values())), "per_client_acc_personalized": final}


def run(cfg: RunConfig, overwrite: bool = False, on_round: RoundCallback | None = None) -> RunResult:
    run_dir = prepare_run_dir(cfg, overwrite)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    d = cfg.data
    data = load_dataset(d.dataset, d.root, d.download, options=d.options)  # decodes once; workers then mmap
    groups = None if data.train_groups is None else (data.train_groups, data.test_groups)
    partition = make_partition(d.partition, data.train_y, data.test_y, d.num_clients, cfg.seed, k=d.k,
                               shards_per_client=d.shards_per_client, beta=d.beta, groups=groups,
                               train_fraction=d.train_fraction, test_fraction=d.test_fraction)
    partition.save(run_dir / "partition.npz")
    stats = partition.stats(data.train_y, data.test_y, data.num_classes)
    (run_dir / "partition_stats.json").write_text(json.dumps(stats, indent=1))

    connect_ray(cfg)
    check_resources(cfg)
    started = time.perf_counter()
    driver = DriverActor.options(num_cpus=0, scheduling_strategy=_this_node()).remote(
        cfg.model_dump(), partition, data.num_classes, data.input_shape)
    last: dict = {}
    try:
        with open(run_dir / "metrics.jsonl", "w") as metrics, open(run_dir / "rounds.jsonl", "w") as rounds:
            for round_idx in range(1, cfg.train.rounds + 1):
                result = ray.get(driver.round.remote(round_idx), timeout=cfg.engine.round_timeout_s)
                for rec in result["records"]:
                    metrics.write(json.dumps(rec) + "\n")
                row = {"round": round_idx, "seconds": result["seconds"], "sampled": len(result["sampled"]),
                       "bytes_up": result["bytes_up"]}
                if result["records"]:
                    for key in ("acc", "acc_personalized"):
                        if key in result["records"][0]:
                            row[key] = summarize([r[key] for r in result["records"]])
                    last = result
                rounds.write(json.dumps(row) + "\n")
                metrics.flush()
                rounds.flush()
                if on_round:
                    on_round(row, result)
        workers = ray.get(driver.worker_info.remote(), timeout=cfg.engine.round_timeout_s)
    finally:
        ray.get(driver.shutdown.remote(), timeout=60)
        ray.kill(driver)
    final = {r["client"]: r["acc"] for r in last["records"]}
    summary = {"name": cfg.name, "algorithm": cfg.algorithm, "rounds": cfg.train.rounds,
               "acc": summarize(list(final.values())), "per_client_acc": final,
               **_personalized_summary(last["records"]),
               "wall_seconds": time.perf_counter() - started, "workers": workers}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return RunResult(cfg.name, run_dir, summary)
