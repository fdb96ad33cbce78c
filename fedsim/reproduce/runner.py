"""Materialize a paper's runs for each seed and bring each to completion: finished runs are skipped,
interrupted ones continue from their checkpoint, runs whose settings changed start again. A run may start from
another run's model (an override set to ``RunFolder(key)``): that run, of the same seed, is planned before it, and
it starts only once that run has finished (and again if that run ran again since)."""
from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim import safe_files, strict_yaml
from fedsim.config import RunConfig, load_tree, merge_trees, parse_overrides, set_dotted, validate
from fedsim.core import runfiles
from fedsim.core.protocol import ACCURACIES
from fedsim.errors import ConfigError
from fedsim.metrics.logger import CPU_COUNTED_ONCE, read_jsonl
from fedsim.reproduce import archive
from fedsim.reproduce.claims import Claim, Paper, RunFolder
from fedsim.sweep.runs import claimed, status

# The base configs ship inside the package (a built wheel carries them), so an installed fedsim reproduces the
# papers from any folder.
CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class PlannedRun:
    key: str  # the paper's run key
    seed: int
    config: RunConfig
    needs: tuple[RunConfig, ...] = ()  # runs of the same seed this one starts from (planned before it)

    @property
    def folder(self) -> Path:
        return Path(self.config.out_dir) / self.config.name

    def estimable(self) -> RunConfig:
        """The config its work is estimated from: a run starting from another run's weights (``needs``: FedBABU's
        fine-tuning) does the same work from fresh ones, and those weights do not exist before that run has run."""
        if not self.needs:
            return self.config
        return self.config.model_copy(update={"model": self.config.model.model_copy(update={"init_from": None})})

    def result(self) -> dict | None:
        """The run's summary where its folder holds this very run, finished; None otherwise. A folder of the same
        name made with other settings (a kept run of an earlier plan: ``changed``) is not this run's result, so a
        choice or a table never reads it as one."""
        return read_summary(self.folder) if status(self.config) == "finished" else None


def base_tree(paper: Paper, scale: str, configs: Path = CONFIGS) -> dict:
    """The scale's base config as a tree, without its own sweep (the claims say what varies)."""
    if scale not in paper.bases:
        raise ConfigError(f"--scale: {scale!r} is not one of {sorted(paper.bases)}")
    tree = load_tree(configs / paper.bases[scale])
    tree.pop("sweep", None)
    return tree


def run_name(paper: Paper, scale: str, key: str, seed: int) -> str:
    return f"{paper.key}-{scale}-{key}-s{seed}"


def run_trees(paper: Paper, scale: str, overrides: Sequence[str] = (),
              configs: Path = CONFIGS) -> dict[str, dict]:
    """Each run key's config tree at this scale (name, seed and out_dir still to set)."""
    base, extra = base_tree(paper, scale, configs), parse_overrides(list(overrides))
    return {key: merge_trees(configure(base, paper.overrides(key, scale)), extra) for key in paper.runs}


def folder_keys(trees: dict[str, dict]) -> dict[str, str]:
    """Run key -> the key whose folder holds it: keys whose settings come out the same at a scale (FedPer's
    K_P = 1 arm is its base run on the 4-conv CNN, not on MobileNet) share one run."""
    first: dict[str, str] = {}
    return {key: first.setdefault(json.dumps(validate(resolve(tree, lambda dep: f"<run {dep}>")).model_dump(),
                                             sort_keys=True, default=str), key)
            for key, tree in trees.items()}


def needs_of(tree: Any) -> list[str]:
    """The run keys whose folders a run's tree names (``RunFolder`` values), in the tree's order."""
    if isinstance(tree, RunFolder):
        return [tree.key]
    if isinstance(tree, dict):
        return [key for value in tree.values() for key in needs_of(value)]
    if isinstance(tree, list):
        return [key for value in tree for key in needs_of(value)]
    return []


def resolve(tree: Any, folder: Callable[[str], str]) -> Any:
    """The tree with every ``RunFolder(key)`` replaced by ``folder(key)``."""
    if isinstance(tree, RunFolder):
        return folder(tree.key)
    if isinstance(tree, dict):
        return {k: resolve(v, folder) for k, v in tree.items()}
    if isinstance(tree, list):
        return [resolve(v, folder) for v in tree]
    return tree


def dependency_order(keys: list[str], needs: dict[str, list[str]]) -> list[str]:
    """``keys`` and every run they need (transitively), each once, every run after the runs it needs and otherwise
    in the given order."""
    ordered: list[str] = []

    def visit(key: str, path: tuple[str, ...]) -> None:
        if key in path:
            raise ConfigError(f"reproduce: runs {' -> '.join((*path, key))} need each other in a circle; "
                              "a run may only start from a run that does not need it")
        if key not in ordered:
            for dep in needs[key]:
                visit(dep, (*path, key))
            ordered.append(key)

    for key in keys:
        visit(key, ())
    return ordered


def plan(paper: Paper, claims: tuple[Claim, ...], scale: str, seeds: int | None, runs_dir: Path,
         overrides: Sequence[str] = (), configs: Path = CONFIGS) -> list[PlannedRun]:
    """Every run the claims need, once, for the seeds each claim fixes (``Claim.seeds``: a run read by several
    claims gets the most of them; ``seeds``, when given, caps every claim at that many, which leaves a capped claim
    inconclusive), seed-major (all runs of seed 0 first), so a partial suite already holds every claim at fewer
    seeds; within a seed a run that starts from another (``RunFolder``) comes after it, and that run is planned for
    as many seeds as the runs that start from it, even where no claim reads it. ``overrides`` (key=value) apply to
    every run, after the claim's own."""
    trees = run_trees(paper, scale, overrides, configs)
    folders = folder_keys(trees)
    for key, tree in trees.items():
        for dep in needs_of(tree):
            if dep not in trees:
                raise ConfigError(f"reproduce: {paper.key} run {key!r} starts from run {dep!r}, which the paper does "
                                  f"not define; name one of {sorted(trees)}")
    needs = {key: list(dict.fromkeys(folders[dep] for dep in needs_of(tree))) for key, tree in trees.items()}
    keys = dependency_order(list(dict.fromkeys(folders[key] for key in paper.runs_of(claims, scale))), needs)
    count: dict[str, int] = {}
    for key, n in paper.seeds_of(claims, scale, seeds).items():
        count[folders[key]] = max(count.get(folders[key], 0), n)
    for key in reversed(keys):  # a needed run comes before the runs needing it: it gets their seeds
        for dep in needs[key]:
            count[dep] = max(count.get(dep, 0), count.get(key, 0))
    planned = []
    for seed in range(max(count.values(), default=0)):
        made: dict[str, RunConfig] = {}

        def folder(dep: str, seed: int = seed) -> str:
            return str(runs_dir / run_name(paper, scale, folders[dep], seed))

        for key in (k for k in keys if seed < count.get(k, 0)):
            tree = {**resolve(trees[key], folder), "name": run_name(paper, scale, key, seed), "seed": seed,
                    "out_dir": str(runs_dir)}
            made[key] = validate(tree)
            planned.append(PlannedRun(key, seed, made[key], tuple(made[dep] for dep in needs[key])))
    return planned


def configure(base: dict, overrides: dict[str, Any | Callable[[dict], Any]]) -> dict:
    """The base with a run's overrides set; a callable value is computed from the base (e.g. rounds from tau)."""
    tree = copy.deepcopy(base)
    for dotted, value in overrides.items():
        set_dotted(tree, dotted, value(base) if callable(value) else copy.deepcopy(value))
    return tree


def execute(planned: list[PlannedRun], say: Callable[[str], None] = print, max_concurrent: int | None = None,
            name: str = "reproduce", kept: Path | None = None) -> None:
    """Bring every planned run to completion, one line per run; runs another process is training are left to it.
    ``max_concurrent``: that many runs at once as trials of one Ray Tune sweep (``name``), on the current cluster.
    ``kept``: the archive each finished run is kept in (``archive.keep``), as soon as it finishes."""
    if max_concurrent is not None:
        from fedsim.config import SearchConfig
        from fedsim.sweep.executor import Sweep, run_sweep

        for wave in waves(planned):  # a run that starts from another's model goes in a later sweep than that run
            for item in wave:
                state, again = status(item.config), _ran_again(item)
                if state != "finished" or again:
                    check_needs(item)
                if again:  # the sweep runs a new folder from the start
                    say(f"{item.config.name}: {again} ran again since this run started from its model; running it "
                        "again")
                    shutil.rmtree(item.folder)
            run_sweep(Sweep(name, [item.config for item in wave], SearchConfig()), max_concurrent, say)
            for item in wave:
                keep_finished(item, planned, kept)
        return
    elsewhere: set[str] = set()  # runs another process is training
    for i, item in enumerate(planned, 1):
        where = f"[{i}/{len(planned)}] {item.config.name}"
        busy = [dep.name for dep in item.needs if dep.name in elsewhere]
        if busy:
            elsewhere.add(item.config.name)
            say(f"{where}: starts from {busy[0]}'s model, which another process is running; skipped (run the "
                "command again once it has finished)")
            continue
        with claimed(item.config) as mine:
            if mine:
                _complete(item, where, say)
                keep_finished(item, planned, kept)
            else:
                elsewhere.add(item.config.name)
                say(f"{where}: another process is running it, skipped")


def keep_finished(item: PlannedRun, planned: list[PlannedRun], kept: Path | None) -> None:
    """Archive ``item`` if it has finished and the archive does not hold it as it is now; with its model where
    another planned run starts from it."""
    if kept is None or status(item.config) != "finished":
        return
    needed = any(dep.name == item.config.name for other in planned for dep in other.needs)
    if not archive.is_kept(item.folder, kept, needed):
        archive.keep(item.folder, kept, needed)


def waves(planned: list[PlannedRun]) -> list[list[PlannedRun]]:
    """The planned runs in groups that can run at once: first those that need no other run, then those whose
    needed runs are all in earlier groups, and so on (each group in the plan's order)."""
    depth: dict[str, int] = {}
    for item in planned:  # the plan puts every run after the runs it needs
        depth[item.config.name] = 1 + max((depth.get(dep.name, -1) for dep in item.needs), default=-1)
    groups: list[list[PlannedRun]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for item in planned:
        groups[depth[item.config.name]].append(item)
    return groups


def check_needs(item: PlannedRun) -> None:
    """Refuse to start a run whose needed run (its model.init_from) is missing or has not finished."""
    for dep in item.needs:
        state = status(dep)
        folder = Path(dep.out_dir) / dep.name
        if state != "finished" or not (folder / runfiles.MODEL).exists():
            what = {"new": "has no run folder", "changed": "holds other settings"}.get(state, "has not finished")
            raise ConfigError(f"reproduce: {item.config.name} starts from {dep.name}'s final model, but {dep.name} "
                              f"{what} ({folder}); bring {dep.name} to completion first (`fedsim reproduce` runs it "
                              f"before {item.config.name} when both are planned: run the command again)")


def _ran_again(item: PlannedRun) -> str | None:
    """A needed run whose model was written after this run started from it (its settings changed and it ran
    again): this run's start is stale. Read from the file times of the local run folders."""
    own = item.folder / (runfiles.SUMMARY if (item.folder / runfiles.SUMMARY).exists() else runfiles.CONFIG)
    if not own.exists():
        return None
    for dep in item.needs:
        model = Path(dep.out_dir) / dep.name / runfiles.MODEL
        if model.exists() and model.stat().st_mtime > own.stat().st_mtime:
            return dep.name
    return None


def _complete(item: PlannedRun, where: str, say: Callable[[str], None]) -> None:
    from fedsim.simulate import run

    state = status(item.config)  # read under the lock: another process may have just finished it
    again = _ran_again(item) if state in ("finished", "resumable") else None
    if state == "finished" and not again:
        say(f"{where}: finished, skipped")
        return
    check_needs(item)
    if again:
        state = "changed"
        say(f"{where}: {again} ran again since this run started from its model; running it again")
    elif state == "changed":
        say(f"{where}: its settings changed since it ran; running it again")
    say(f"{where}: {'resuming' if state == 'resumable' else 'running'}")
    result = run(item.config, overwrite=state == "changed", resume=state == "resumable")
    scores = ", ".join(f"{name} {100 * result.summary[key]['mean']:.2f}%" for key, name in ACCURACIES.items()
                       if key in result.summary)
    say(f"{where}: {scores} ({run_seconds(item.folder):.0f} s of rounds)")


def read_summary(folder: Path) -> dict | None:
    path = folder / runfiles.SUMMARY
    return json.loads(safe_files.read_text(path)) if path.exists() else None


def client_values_at(folder: Path, metric: str, at: int | float) -> list[float] | None:
    """The per-client accuracies (0..1) of one evaluation round of a finished run, from its metrics.jsonl (a row per
    client per evaluation round), or None when the run has not finished: a point on the run's curve, for a claim
    about how fast a method converges (an ``Arm`` with ``round``). ``at``: the round, or a fraction in (0, 1) of the
    run's rounds (rounded up)."""
    summary = read_summary(folder)
    if summary is None:
        return None
    round_idx = at if isinstance(at, int) else math.ceil(at * summary["rounds"])
    rows = [r for r in read_jsonl(folder / runfiles.METRICS) if r["round"] == round_idx and metric in r]
    if not rows:
        raise ValueError(f"{folder}: metrics.jsonl has no {metric} for round {round_idx} (the run did not evaluate "
                         "that round: set train.eval_every so that it does)")
    return [float(r[metric]) for r in rows]


def client_means(folder: Path, metric: str) -> dict[int, float] | None:
    """Evaluation round -> client-mean accuracy (0..1) of a finished run, from its metrics.jsonl (a row per client
    per evaluation round), or None when the run has not finished: the run's curve."""
    if read_summary(folder) is None:
        return None
    by_round: dict[int, list[float]] = {}
    for row in read_jsonl(folder / runfiles.METRICS):
        if metric in row:
            by_round.setdefault(int(row["round"]), []).append(float(row[metric]))
    return {r: sum(v) / len(v) for r, v in by_round.items()}


def run_cpu_seconds(folder: Path) -> float | None:
    """The run's rounds' CPU time (rounds.jsonl ``cpu_seconds``: the workers' calls and the server), across every
    resume; None for a run with a round written before rounds recorded it, or, on the local backend, before they
    counted its one process once (``CPU_COUNTED_ONCE``: those counted it twice)."""
    rows = read_jsonl(folder / runfiles.ROUNDS)
    if not rows or any("cpu_seconds" not in row for row in rows):
        return None
    if not all(row.get(CPU_COUNTED_ONCE) for row in rows) and _backend(folder) == "local":
        return None
    return float(sum(row["cpu_seconds"] for row in rows))


def _backend(folder: Path) -> str | None:
    """The engine.backend the run folder's config.yaml names (None where it cannot be read)."""
    try:
        tree = strict_yaml.load((folder / runfiles.CONFIG).read_text())
    except (OSError, ValueError):
        return None
    engine = tree.get("engine") if isinstance(tree, dict) else None
    return engine.get("backend") if isinstance(engine, dict) else None


def run_seconds(folder: Path) -> float:
    """The run's rounds' time (training, aggregation, evaluation; Ray's start-up excluded), counted across
    every resume: rounds.jsonl holds each round once (a resume truncates it to its checkpoint), where
    summary.json's wall_seconds also counts each part's start-up and the rounds a resume redid."""
    return float(sum(row["seconds"] for row in read_jsonl(folder / runfiles.ROUNDS)))
