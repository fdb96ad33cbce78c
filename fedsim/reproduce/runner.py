"""Materialize a paper's runs for each seed and bring each to completion: finished runs are skipped,
interrupted ones continue from their checkpoint, runs whose settings changed start again."""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fedsim.config import ConfigError, RunConfig, load_tree, merge_trees, parse_overrides, set_dotted, validate
from fedsim.core.protocol import ACCURACIES
from fedsim.metrics.logger import read_jsonl
from fedsim.reproduce.claims import Claim, Paper
from fedsim.sweep.runs import claimed, status

# The base configs ship inside the package (a built wheel carries them), so an installed fedsim reproduces the
# papers from any folder.
CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class PlannedRun:
    key: str  # the paper's run key
    seed: int
    config: RunConfig

    @property
    def folder(self) -> Path:
        return Path(self.config.out_dir) / self.config.name


def base_tree(paper: Paper, scale: str, configs: Path = CONFIGS) -> dict:
    """The scale's base config as a tree, without its own sweep (the claims say what varies)."""
    if scale not in paper.bases:
        raise ConfigError(f"--scale: {scale!r} is not one of {sorted(paper.bases)}")
    tree = load_tree(configs / paper.bases[scale])
    tree.pop("sweep", None)
    return tree


def run_name(paper: Paper, scale: str, key: str, seed: int) -> str:
    return f"{paper.key}-{scale}-{key}-s{seed}"


def run_trees(paper: Paper, scale: str, overrides: list[str] = (),
              configs: Path = CONFIGS) -> dict[str, dict]:
    """Each run key's config tree at this scale (name, seed and out_dir still to set)."""
    base, extra = base_tree(paper, scale, configs), parse_overrides(list(overrides))
    return {key: merge_trees(configure(base, paper.overrides(key, scale)), extra) for key in paper.runs}


def folder_keys(trees: dict[str, dict]) -> dict[str, str]:
    """Run key -> the key whose folder holds it: keys whose settings come out the same at a scale (FedPer's
    K_P = 1 arm is its base run on the 4-conv CNN, not on MobileNet) share one run."""
    first: dict[str, str] = {}
    return {key: first.setdefault(json.dumps(validate(tree).model_dump(), sort_keys=True, default=str), key)
            for key, tree in trees.items()}


def plan(paper: Paper, claims: tuple[Claim, ...], scale: str, seeds: int, runs_dir: Path,
         overrides: list[str] = (), configs: Path = CONFIGS) -> list[PlannedRun]:
    """Every run the claims need, once, seed-major (all runs of seed 0 first), so a partial suite already holds
    every claim at fewer seeds. ``overrides`` (key=value) apply to every run, after the claim's own."""
    trees = run_trees(paper, scale, overrides, configs)
    folders = folder_keys(trees)
    keys = list(dict.fromkeys(folders[key] for key in paper.runs_of(claims)))
    planned = []
    for seed in range(seeds):
        for key in keys:
            tree = {**trees[key], "name": run_name(paper, scale, key, seed), "seed": seed, "out_dir": str(runs_dir)}
            planned.append(PlannedRun(key, seed, validate(tree)))
    return planned


def configure(base: dict, overrides: dict[str, Any | Callable[[dict], Any]]) -> dict:
    """The base with a run's overrides set; a callable value is computed from the base (e.g. rounds from tau)."""
    tree = copy.deepcopy(base)
    for dotted, value in overrides.items():
        set_dotted(tree, dotted, value(base) if callable(value) else copy.deepcopy(value))
    return tree


def execute(planned: list[PlannedRun], say: Callable[[str], None] = print, max_concurrent: int | None = None,
            name: str = "reproduce") -> None:
    """Bring every planned run to completion, one line per run; runs another process is training are left to it.
    ``max_concurrent``: that many runs at once as trials of one Ray Tune sweep (``name``), on the current cluster."""
    if max_concurrent is not None:
        from fedsim.config import SearchConfig
        from fedsim.sweep.executor import Sweep, run_sweep

        run_sweep(Sweep(name, [item.config for item in planned], SearchConfig()), max_concurrent, say)
        return
    for i, item in enumerate(planned, 1):
        where = f"[{i}/{len(planned)}] {item.config.name}"
        with claimed(item.config) as mine:
            if mine:
                _complete(item, where, say)
            else:
                say(f"{where}: another process is running it, skipped")


def _complete(item: PlannedRun, where: str, say: Callable[[str], None]) -> None:
    from fedsim.simulate import run

    state = status(item.config)  # read under the lock: another process may have just finished it
    if state == "finished":
        say(f"{where}: finished, skipped")
        return
    if state == "changed":
        say(f"{where}: its settings changed since it ran; running it again")
    say(f"{where}: {'resuming' if state == 'resumable' else 'running'}")
    result = run(item.config, overwrite=state == "changed", resume=state == "resumable")
    scores = ", ".join(f"{name} {100 * result.summary[key]['mean']:.2f}%" for key, name in ACCURACIES.items()
                       if key in result.summary)
    say(f"{where}: {scores} ({run_seconds(item.folder):.0f} s of rounds)")


def read_summary(folder: Path) -> dict | None:
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_seconds(folder: Path) -> float:
    """The run's rounds' time (training, aggregation, evaluation; Ray's start-up excluded), counted across
    every resume: rounds.jsonl holds each round once (a resume truncates it to its checkpoint), where
    summary.json's wall_seconds covers the last invocation only."""
    return float(sum(row["seconds"] for row in read_jsonl(folder / "rounds.jsonl")))
