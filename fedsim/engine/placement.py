"""Where the workers run: their resources reserved as one placement group (one bundle per worker), which a
cluster's autoscaler sees as a single demand and adds nodes for; and a check that a local ``out_dir`` is
visible from every node the run uses."""
from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from fedsim.config import RunConfig
from fedsim.errors import ConfigError

FIRST_LOOK_S = 1.0
PROGRESS_EVERY_S = 15.0


def worker_bundle(cfg: RunConfig) -> dict[str, float]:
    engine = cfg.engine
    return {k: v for k, v in (("CPU", engine.cpus_per_worker), ("GPU", engine.gpus_per_worker)) if v > 0}


def _describe(workers: int, bundle: dict[str, float]) -> str:
    each = ", ".join(f"{v:g} {k}" for k, v in bundle.items())
    return f"{workers} workers x ({each})"


def reserve(cfg: RunConfig, workers: int) -> PlacementGroup | None:
    """Reserve ``workers`` bundles, waiting up to engine.wait_for_resources_s while the cluster (its
    autoscaler) makes room, and saying what it waits for. None when workers need no resources."""
    bundle = worker_bundle(cfg)
    if not bundle:
        return None
    group: PlacementGroup = placement_group([bundle] * workers, strategy="SPREAD")
    limit = cfg.engine.wait_for_resources_s
    deadline = time.monotonic() + limit
    wait, said = min(FIRST_LOOK_S, limit), False  # a cluster with room answers at once: say nothing then
    while not ray.wait([group.ready()], timeout=wait)[0]:
        left = max(0.0, deadline - time.monotonic())
        if said and left == 0:
            remove_placement_group(group)
            raise ConfigError(f"engine.wait_for_resources_s: the Ray cluster found no room for {_describe(workers, bundle)} "
                              f"within {limit:g} s (it has {_free()} free); check its node types and autoscaler "
                              "(`ray status`), raise engine.wait_for_resources_s, or lower engine.workers")
        print(f"fedsim: waiting for the cluster to make room for {_describe(workers, bundle)} (free now: {_free()}); "
              f"giving up in {left:.0f} s (engine.wait_for_resources_s)", file=sys.stderr, flush=True)
        wait, said = min(PROGRESS_EVERY_S, left), True
    return group


def _free() -> str:
    free = ray.available_resources()
    return ", ".join(f"{free.get(k, 0):g} {k}" for k in ("CPU", "GPU"))


def bundles(group: PlacementGroup | None, workers: int) -> list[PlacementGroupSchedulingStrategy | str]:
    """Worker i's scheduling strategy: bundle i of the group (or Ray's SPREAD when nothing is reserved)."""
    if group is None:
        return ["SPREAD"] * workers
    return [PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i) for i in range(workers)]


def release(group: PlacementGroup | None) -> None:
    if group is not None:
        remove_placement_group(group)


def nodes_of(group: PlacementGroup | None) -> set[str]:
    """The node ids that hold the group's bundles, and this process's node."""
    here = {ray.get_runtime_context().get_node_id()}
    return here if group is None else here | set(placement_group_table(group)["bundles_to_node_id"].values())


@ray.remote(num_cpus=0)
def _reads(path: str, content: str) -> bool:
    try:
        return Path(path).read_text() == content
    except OSError:
        return False


def check_shared(out_dir: Path, nodes: set[str], timeout_s: float) -> None:
    """Refuse a local out_dir that some node of the run cannot see: its workers would write checkpoints
    into a folder of their own node. Each node reads a marker this process writes."""
    if len(nodes) < 2:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    marker, content = out_dir / f".fedsim-shared-{uuid.uuid4().hex}", uuid.uuid4().hex
    marker.write_text(content)
    try:
        checks = [_reads.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            str(marker), content) for node in sorted(nodes)]
        blind = [node for node, seen in zip(sorted(nodes), ray.get(checks, timeout=timeout_s)) if not seen]
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}.get(blind[0], blind[0])
        raise ConfigError(f"out_dir: {out_dir} is not shared with {len(blind)} of the run's {len(nodes)} nodes "
                          f"(e.g. {address}); set out_dir to a bucket every node can write (s3://BUCKET/runs, "
                          "gs://BUCKET/runs) or to a folder all nodes mount")
