"""``fedsim tune``: methods compared with the same chance of a good setting, chosen on validation only.

Every method of ``tune.methods`` is searched in the two stages of :mod:`fedsim.sweep.search` (the shared settings
at the method's own defaults, then ``tune.own_trials`` settings of its own parameters at its first-stage choice),
each trial at ``tune.seeds`` for ``tune.rounds`` rounds. The trial with the highest mean validation accuracy at the
final round (the accuracy the protocol reports: personalized where the run personalizes) is chosen, and its settings
run again at seeds 0..final_seeds-1 for ``tune.final_rounds``, whose test accuracy the table reports. Each stage is a
sweep (``fedsim.sweep.executor``): a rerun finds finished runs and trains only what is missing."""
from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import yaml

from fedsim import storage
from fedsim.config import Distribution, RunConfig, SearchConfig, TuneConfig, set_dotted, validate
from fedsim.core.protocol import on_validation
from fedsim.errors import ConfigError, TuningIncomplete
from fedsim.metrics.confidence import mean_ci
from fedsim.metrics.receipt import receipt, receipt_table
from fedsim.sweep import search as design
from fedsim.sweep.executor import Outcome, Sweep, run_sweep
from fedsim.sweep.expand import expand_sweep
from fedsim.sweep.tune_checks import SHARED_KEYS, refuse_endless_tuning, refuse_unused_keys


@dataclass(frozen=True)
class MethodSearch:
    """One method's search: its entry in tune.methods, its own space (``algorithm.<param>``), the settings of each
    trial (the first ``first`` are stage 1's, the rest stage 2's once stage 1 has chosen) and, per trial, its runs
    (one per search seed)."""
    method: str
    entry: dict[str, Any]
    own: dict[str, Distribution]
    trials: list[dict[str, Any]]
    runs: list[list[RunConfig]]
    first: int

    @property
    def stage_one(self) -> list[list[RunConfig]]:
        return self.runs[:self.first]


@dataclass(frozen=True)
class TunePlan:
    """What ``fedsim tune`` runs: the config as written, its tree (without ``tune``, at the search's rounds), the
    rounds of the search and final runs and each method's search (stage 1 planned; stage 2 once it has chosen)."""
    base: RunConfig
    tune: TuneConfig
    tree: dict[str, Any]
    rounds: int
    final_rounds: int
    methods: list[MethodSearch]

    @property
    def search_runs(self) -> list[RunConfig]:
        return [cfg for m in self.methods for trial in m.runs for cfg in trial]

    @property
    def folder(self) -> str:
        """Where the chosen configs and the table go: ``out_dir/tune/<name>``."""
        return storage.join(self.base.out_dir, "tune", self.base.name)

    def budget(self) -> str:
        return budget_text(self.tune, self.rounds, self.final_rounds, {m.method: m.first for m in self.methods})


def budget_text(tune: TuneConfig, rounds: int, final_rounds: int, first: dict[str, int]) -> str:
    """The budget per method: its trials (stage 1's shared settings + stage 2's) x search seeds x rounds, and the
    finals; a method that ignores a shared setting runs fewer stage-1 points (named)."""
    shared = (f"a grid of {len(tune.grid.step)} effective steps lr/(1-m) {tune.grid.step} x momentum "
              f"{tune.grid.momentum}" if tune.grid is not None else f"{tune.trials} draws of the shared space")
    full = max(first.values(), default=0)
    fewer = {m: n for m, n in first.items() if n < full}
    seeds = f"{len(tune.seeds)} search seed(s) ({', '.join(map(str, tune.seeds))})"
    final = "1 seed (0)" if tune.final_seeds == 1 else f"{tune.final_seeds} seeds (0..{tune.final_seeds - 1})"
    return (f"stage 1: {shared}, each method at its own defaults ({full} trials); stage 2: {tune.own_trials} trials of "
            f"each method's own parameters at its stage-1 choice (the step refined where it has none); each trial "
            f"x {seeds} x {rounds} rounds; the chosen settings at {final} x {final_rounds} rounds"
            + ("" if not fewer else "; " + ", ".join(f"{m} runs {n} stage-1 trials (the others differ only in a "
                                                     "setting it ignores)" for m, n in fewer.items())))


def plan_tuning(tree: dict[str, Any]) -> TunePlan:
    """Validate the config and plan every method's first stage; refuses (one line) a config without ``tune``."""
    base = validate(tree)
    if base.tune is None:
        raise ConfigError("tune: this config has no tune section; add tune: {methods: [...], trials: N, seeds: [...]}")
    rounds = base.tune.rounds or base.train.rounds
    refuse_endless_tuning(base.model_copy(update={"train": base.train.model_copy(update={"rounds": rounds})}),
                          base.tune)
    run_tree = {k: v for k, v in copy.deepcopy(tree).items() if k != "tune"}
    set_dotted(run_tree, "train.rounds", rounds)
    refuse_unused_keys(base.model.client, base.tune.space)
    shared = design.shared_trials(base.tune, base.seed)
    return TunePlan(base, base.tune, run_tree, rounds, base.tune.final_rounds or rounds,
                    [_method_search(base, run_tree, entry.model_dump(by_alias=True), shared)
                     for entry in base.tune.methods])


def _method_search(base: RunConfig, run_tree: dict[str, Any], entry: dict[str, Any],
                   shared: list[dict[str, Any]]) -> MethodSearch:
    tune = base.tune
    assert tune is not None
    method = entry["name"]
    own = design.own_space(method, entry)
    trials = design.for_method(method, shared)
    runs = [_trial_runs(run_tree, entry, values, f"{base.name}-{method}-t{k}", tune.seeds)
            for k, values in enumerate(trials)]
    return MethodSearch(method, entry, own, trials, runs, len(trials))


def _trial_runs(run_tree: dict[str, Any], entry: dict[str, Any], values: dict[str, Any], name: str,
                seeds: Sequence[int]) -> list[RunConfig]:
    return [_run(run_tree, entry, values, name, seed) for seed in seeds]


def second_stage(plan: TunePlan, search: MethodSearch, choice: Choice) -> MethodSearch:
    """The method's search with stage 2 planned at its stage-1 ``choice``."""
    tune = plan.tune
    added = design.own_trials(plan.base.seed, search.method, search.own, search.trials[choice.trial],
                              tune.own_trials)
    runs = [_trial_runs(plan.tree, search.entry, values, f"{plan.base.name}-{search.method}-o{k}", tune.seeds)
            for k, values in enumerate(added)]
    return replace(search, trials=search.trials + added, runs=search.runs + runs)


def method_tree(run_tree: dict[str, Any], entry: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The run tree with the method ``entry`` and a trial's ``values`` set."""
    tree = copy.deepcopy(run_tree)
    tree["algorithm"] = dict(entry)
    for key, value in values.items():
        for dotted in SHARED_KEYS.get(key, (key,)):
            set_dotted(tree, dotted, value)
    return tree


def _run(run_tree: dict[str, Any], entry: dict[str, Any], values: dict[str, Any], name: str, seed: int) -> RunConfig:
    tree = method_tree(run_tree, entry, values)
    tree.update(name=f"{name}-s{seed}", seed=seed)
    tree.setdefault("logging", {}).setdefault("wandb", {}).setdefault("group", name)  # W&B averages a trial's seeds
    try:
        return validate(tree)
    except ConfigError as err:
        raise ConfigError(f"tune: {err} (in the run {tree['name']})") from None


def reported_key(cfg: RunConfig) -> str:
    """The accuracy the protocol reports: personalized where the run personalizes, else the model each client holds."""
    return "acc_personalized" if cfg.eval.personalizes else "acc"


def selection_key(cfg: RunConfig) -> str:
    """The validation accuracy a trial is chosen on: the reported one, on the validation split."""
    return on_validation(reported_key(cfg))


def validation_part(summary: dict) -> dict:
    """A run summary's validation scores alone: what the chooser may read."""
    return {key: value for key, value in summary.items() if key.startswith(on_validation(""))}


@dataclass(frozen=True)
class Choice:
    """A method's chosen trial, its mean validation score there (a fraction) and the trials left out (failed)."""
    trial: int
    score: float
    failed: list[int]


def choose(method: str, trials: Sequence[Sequence[dict | None]], key: str) -> Choice:
    """The trial with the highest mean over its seeds of ``key`` (first on a tie), from each run's validation scores
    (``validation_part`` of its summary; None where the run failed). A trial with a failed run is out."""
    scores: dict[int, float] = {}
    failed = []
    for k, runs in enumerate(trials):
        if any(run is None or key not in run for run in runs):
            failed.append(k)
            continue
        scores[k] = float(np.mean([run[key]["mean"] for run in runs if run is not None]))
    if not scores:
        raise TuningIncomplete(f"every trial of {method} failed (their causes above); move or narrow the space")
    best = max(scores, key=lambda k: (scores[k], -k))
    return Choice(best, scores[best], failed)


def _summaries(outcomes: Sequence[Outcome]) -> dict[str, dict | None]:
    return {o.name: (o.summary if o.state == "finished" else None) for o in outcomes}


def _refuse_skipped(outcomes: Sequence[Outcome]) -> None:
    skipped = [o.name for o in outcomes if o.state == "skipped"]
    if skipped:
        raise TuningIncomplete(f"another process holds {', '.join(skipped)}; run the same command once it is done")


@dataclass(frozen=True)
class Final:
    """A method's choice, the config of its chosen settings (``fedsim run`` runs it) and that config's runs."""
    choice: Choice
    tree: dict[str, Any]
    runs: list[RunConfig]


def final_tree(plan: TunePlan, search: MethodSearch, choice: Choice) -> dict[str, Any]:
    """The chosen settings as a config `fedsim run` runs: the method at its chosen values, at the final seeds."""
    tree = method_tree(plan.tree, search.entry, search.trials[choice.trial])
    tree["name"] = f"{plan.base.name}-{search.method}"
    set_dotted(tree, "train.rounds", plan.final_rounds)
    tree["sweep"] = {"seed": list(range(plan.tune.final_seeds))}
    return tree


def chosen_trial(search: MethodSearch, runs: Sequence[Sequence[RunConfig]],
                 searched: dict[str, dict | None]) -> Choice:
    """The method's choice among ``runs`` (a stage's, or all) from their validation scores alone."""
    trials = [[_validation_or_none(searched[cfg.name]) for cfg in trial] for trial in runs]
    return choose(search.method, trials, selection_key(runs[0][0]))


def _final(plan: TunePlan, search: MethodSearch, searched: dict[str, dict | None]) -> Final:
    choice = chosen_trial(search, search.runs, searched)
    tree = final_tree(plan, search, choice)
    return Final(choice, tree, expand_sweep(tree))


def run_tuning(plan: TunePlan, max_concurrent: int | None = None, say: Callable[[str], None] = print, *,
               overwrite: bool = False, quiet: bool = False) -> dict:
    """Search, choose on validation, run the choices at the final seeds; write each chosen config and the table.
    ``overwrite`` and ``quiet`` as for :func:`run_sweep`. Returns the table's data (also ``results.json``)."""
    def phase(name: str, configs: list[RunConfig]) -> list[Outcome]:
        if not configs:  # a stage with nothing to search: no own parameters and no shared lr to refine
            return []
        outcomes = run_sweep(Sweep(name, configs, SearchConfig()), max_concurrent, say, overwrite=overwrite,
                             quiet=quiet)
        _refuse_skipped(outcomes)
        return outcomes

    searched = _summaries(phase(f"{plan.base.name}-tune-search", plan.search_runs))
    searches = [second_stage(plan, search, chosen_trial(search, search.stage_one, searched))
                for search in plan.methods]
    own = [cfg for search in searches for trial in search.runs[search.first:] for cfg in trial]
    searched |= _summaries(phase(f"{plan.base.name}-tune-own", own))
    plan = replace(plan, methods=searches)
    finals = {search.method: _final(plan, search, searched) for search in plan.methods}
    store = storage.Store(plan.folder)
    for method, final in finals.items():
        store.write_bytes(f"{method}.yaml", yaml.safe_dump(final.tree, sort_keys=False).encode())
    final_runs = [cfg for final in finals.values() for cfg in final.runs]
    ended = _summaries(phase(f"{plan.base.name}-tune-final", final_runs))
    rows = [_row(plan, search, finals[search.method], ended) for search in plan.methods]
    table = {"budget": plan.budget(), "rounds": plan.rounds, "final_rounds": plan.final_rounds,
             "seeds": plan.tune.seeds, "final_seeds": list(range(plan.tune.final_seeds)), "selection": SELECTION, "methods": rows}
    store.write_bytes("results.json", json.dumps(table, indent=1).encode())
    store.write_bytes("results.md", results_markdown(plan.base.name, table).encode())
    return table


SELECTION = ("each trial's mean over its seeds of the clients' mean validation accuracy at the final round (the "
             "accuracy the protocol reports: personalized where the run personalizes); test is never read to choose")


def _validation_or_none(summary: dict | None) -> dict | None:
    return None if summary is None else validation_part(summary)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def space_text(space: dict[str, Distribution]) -> str:
    return "; ".join(f"{key} {dist.kind} {list(dist.bounds)}" for key, dist in space.items())


def _row(plan: TunePlan, search: MethodSearch, final: Final, ended: dict[str, dict | None]) -> dict:
    """A method's row: its space, choice, validation score there and the final seeds' test accuracy (percent)."""
    choice, configs = final.choice, final.runs
    key = reported_key(configs[0])
    tests = [summary[key]["mean"] for cfg in configs if (summary := ended.get(cfg.name)) is not None]
    estimate = mean_ci([100 * t for t in tests]) if tests else None
    return {"method": search.method, "space": space_text(search.own) or "-",
            "chosen": search.trials[choice.trial], "trial": design.trial_label(choice.trial, search.first),
            "failed_trials": choice.failed, "validation": 100 * choice.score, "scored": key,
            "test_mean": estimate.mean if estimate else None, "test_low": estimate.low if estimate else None,
            "test_high": estimate.high if estimate else None, "final_runs": len(tests),
            "config": storage.join(plan.folder, f"{search.method}.yaml"),
            "receipt": receipt([cfg.model_dump() for cfg in configs], [key], optimizers=_set_up(configs, ended))}


def _set_up(configs: list[RunConfig], ended: dict[str, dict | None]) -> list[str] | None:
    """The optimizers the final runs set up (a finished run's summary.json; None where none finished)."""
    return next((summary["optimizers"] for cfg in configs
                 if (summary := ended.get(cfg.name)) is not None and "optimizers" in summary), None)


def results_markdown(name: str, table: dict) -> str:
    """The table: budget, each method's space, its choice, the validation score it was chosen on and the final
    seeds' test accuracy (mean, 95% CI); then each method's receipt (optimizer, lr, momentum, rounds, local work,
    what is scored, the round, the seeds)."""
    lines = [f"# Tuning {name}", "", f"Budget: {table['budget']}.", "", f"Selection: {table['selection']}.", "",
             "| method | own space (stage 2) | chosen | validation at selection | test, final seeds (mean [95% CI]) | "
             "final runs | failed trials |", "|---|---|---|---:|---:|---:|---|"]
    for row in table["methods"]:
        chosen = ", ".join(f"{k} {_shown(v)}" for k, v in row["chosen"].items())
        test = "-" if row["test_mean"] is None else f"{row['test_mean']:.2f}" + (
            "" if row["test_low"] is None else f" [{row['test_low']:.2f}, {row['test_high']:.2f}]")
        failed = ", ".join(map(str, row["failed_trials"])) or "-"
        lines.append(f"| {row['method']} | {row['space']} | {chosen} (trial {row['trial']}) | "
                     f"{row['validation']:.2f} | {test} | {row['final_runs']} | {failed} |")
    lines += ["", "What each method's final runs ran and scored:", "",
              *receipt_table([(row["method"], row["receipt"]) for row in table["methods"]])]
    return "\n".join(lines) + "\n"
