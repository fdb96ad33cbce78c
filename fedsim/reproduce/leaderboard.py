"""``fedsim reproduce leaderboard``: every personalized method on PFLlib's two CIFAR-100 label-skew settings, each
for several seeds, in one table of means with 95% confidence intervals, fairness across clients, best-round and
final-round accuracy and time per round, with PFLlib's published numbers beside (named as PFLlib's, its protocol
stated). The runs are ordinary run folders brought to completion by the reproduction runner: an interrupted
leaderboard resumes where it stopped, and the table is written from whatever has finished."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedsim import atomic
from fedsim.config import load_tree, merge_trees, parse_overrides, resume_fingerprint, validate
from fedsim.core import runfiles
from fedsim.errors import ConfigError, TrainingDiverged
from fedsim.metrics.confidence import mean_ci
from fedsim.metrics.receipt import receipt, receipt_table
from fedsim.reproduce.runner import CONFIGS, PlannedRun, configure, execute, read_summary, run_seconds

KEY = "leaderboard"
BASES = {"cpu": "cpu/leaderboard_cifar100.yaml", "paper": "paper/leaderboard_cifar100.yaml"}
SETTINGS: dict[str, dict[str, Any]] = {  # PFLlib's two label-skew settings on CIFAR-100 (docs/benchmark.html)
    "pathological": {"data.partition": {"name": "classes", "k": 10}},  # 10 of the 100 classes per client
    "dirichlet": {"data.partition": {"name": "dirichlet", "beta": 0.1}},  # q_c ~ Dir(0.1)
}
SETTING_TITLES = {"pathological": "CIFAR-100, pathological (10 classes per client)",
                  "dirichlet": "CIFAR-100, Dirichlet β = 0.1"}


@dataclass(frozen=True)
class Entry:
    """A method on the leaderboard: its config overrides, the accuracy it is ranked by, PFLlib's name for it."""
    method: str
    overrides: dict[str, Any] = field(default_factory=dict)
    metric: str = "acc"  # the model each client holds after the method's own personalization
    pfllib: str | None = None  # the row of PFLlib's leaderboard, where it has one
    pfllib_scores: str | None = None  # what PFLlib's number scores, where it is not what this row ranks by


FINETUNE = {"eval.finetune_epochs": 5}  # FedBABU's protocol: the head (here the network) tuned 5 epochs at evaluation
ENTRIES = (
    Entry("fedavg", pfllib="FedAvg"),
    Entry("local"),
    Entry("fedper", pfllib="FedPer"),
    Entry("fedrep", {"algorithm.head_epochs": 1}, pfllib="FedRep"),  # PFLlib: 1 head epoch (plocal_epochs)
    Entry("fedbabu", FINETUNE, metric="acc_personalized", pfllib="FedBABU"),
    Entry("lg_fedavg"),
    Entry("fedbn"),
    Entry("ditto", pfllib="Ditto"),
    Entry("apfl", pfllib="APFL"),
    Entry("perfedavg", pfllib="Per-FedAvg"),
    Entry("pfedme", pfllib="pFedMe"),
    Entry("fedrod", pfllib="FedRoD"),
    Entry("fedala", pfllib="FedALA"),
    # PFLlib scores FedProto by the nearest global prototype (clientproto.py:101-126); fedsim records that too
    # (fedproto_acc_prototypes in each run's records and summary) and ranks by the client's own classifier.
    Entry("fedproto", pfllib="FedProto", pfllib_scores="nearest global prototype (fedsim's: fedproto_acc_prototypes)"),
    Entry("ifca"),
    Entry("fedamp", pfllib="FedAMP"),
    Entry("fedfomo", pfllib="FedFomo"),
)

# PFLlib's leaderboard (TsingZ0/PFLlib docs/benchmark.html, read at commit d832e76): test accuracy %, mean ± std of
# 3 trials (a standard deviation, not an interval), CIFAR-100 pathological and Dir(0.1) columns.
PFLLIB_NUMBERS = {
    "FedAvg": ("25.98 ± 0.13", "31.89 ± 0.47"), "Per-FedAvg": ("56.80 ± 0.26", "44.28 ± 0.33"),
    "pFedMe": ("58.20 ± 0.14", "47.34 ± 0.46"), "Ditto": ("67.23 ± 0.07", "52.87 ± 0.64"),
    "APFL": ("64.26 ± 0.13", "46.74 ± 0.60"), "FedFomo": ("62.49 ± 0.22", "45.39 ± 0.45"),
    "FedAMP": ("64.34 ± 0.37", "47.69 ± 0.49"), "FedALA": ("67.83 ± 0.06", "55.92 ± 0.03"),
    "FedPer": ("63.53 ± 0.21", "49.63 ± 0.54"), "FedRep": ("67.56 ± 0.31", "52.39 ± 0.35"),
    "FedRoD": ("62.30 ± 0.02", "50.94 ± 0.11"), "FedBABU": ("66.85 ± 0.07", "55.02 ± 0.33"),
    "FedProto": ("69.18 ± 0.03", "52.70 ± 0.33"),
}
PFLLIB_PROTOCOL = ("PFLlib's protocol: 20 clients, all join every round, each client's data split 75/25 into train "
                   "and test, a 4-layer CNN (2 conv + 2 fc, no BatchNorm), batch 10, 1 local epoch, lr 0.005, 2,000 "
                   "rounds, the **best** round's accuracy averaged over clients, mean ± std of 3 trials")


def base_tree(scale: str, configs: Path = CONFIGS) -> dict:
    if scale not in BASES:
        raise ConfigError(f"--scale: {scale!r} is not one of {sorted(BASES)}")
    return load_tree(configs / BASES[scale])


def entries(only: str | None) -> tuple[Entry, ...]:
    """Every entry, or (``--only``) one method's."""
    if only is None:
        return ENTRIES
    chosen = tuple(e for e in ENTRIES if e.method == only)
    if not chosen:
        raise ConfigError(f"--only: the leaderboard has no method {only!r}; choose one of "
                          f"{[e.method for e in ENTRIES]}")
    return chosen


def run_key(setting: str, entry: Entry) -> str:
    return f"{setting}-{entry.method}"


def plan(scale: str, seeds: int, runs_dir: Path, overrides: Sequence[str] = (), only: str | None = None,
         configs: Path = CONFIGS) -> list[PlannedRun]:
    """Every run, seed-major (all of seed 0 first), so a partial leaderboard already ranks every method at fewer
    seeds. ``overrides`` (key=value) apply to every run after the entry's own."""
    base, extra = base_tree(scale, configs), parse_overrides(list(overrides))
    planned = []
    for seed in range(seeds):
        for setting, varies in SETTINGS.items():
            for entry in entries(only):
                tree = merge_trees(configure(base, {**varies, "algorithm.name": entry.method, **entry.overrides}), extra)
                key = run_key(setting, entry)
                tree |= {"name": f"{KEY}-{scale}-{key}-s{seed}", "seed": seed, "out_dir": str(runs_dir)}
                planned.append(PlannedRun(key, seed, validate(tree)))
    return planned


class Diverged:
    """The runs whose training diverged (a client's loss not finite, train.on_nonfinite=stop): a result of the
    leaderboard, recorded in ``diverged.json`` where the finished runs are kept (``--kept``), with the settings it
    diverged under, so a resumed leaderboard, here or on another machine, neither retries them (the same seed
    diverges again) nor drops them from the table."""

    def __init__(self, kept: Path):
        self.path = kept / "diverged.json"
        self.runs: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def of(self, item: PlannedRun) -> str | None:
        """Why this run diverged under its present settings, or None."""
        found = self.runs.get(item.config.name)
        return found["error"] if found and found["settings"] == _settings(item) else None

    def record(self, item: PlannedRun, error: str) -> None:
        self.runs[item.config.name] = {"error": error, "settings": _settings(item)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(self.path, json.dumps(self.runs, indent=1))


def _settings(item: PlannedRun) -> str:
    return resume_fingerprint(item.config.model_dump())


def complete(planned: list[PlannedRun], kept: Path, max_concurrent: int | None = None,
             say: Callable[[str], None] = print) -> None:
    """Bring every run to completion (the reproduction runner: finished runs skipped, interrupted ones resumed,
    each kept in ``kept`` as it finishes), recording a run that diverges instead of stopping the leaderboard.
    ``max_concurrent``: as Ray Tune trials on the current cluster (a diverged trial is then reported by Tune as
    failed, and left out of the table)."""
    if max_concurrent is not None:
        execute(planned, say, max_concurrent, name=f"{KEY}-{planned[0].config.name.split('-')[1]}", kept=kept)
        return
    diverged = Diverged(kept)
    for i, item in enumerate(planned, 1):
        where = f"[{i}/{len(planned)}] {item.config.name}"
        why = diverged.of(item)
        if why:
            say(f"{where}: diverged before ({why}), skipped")
            continue
        def say_where(line: str) -> None:  # execute numbers its one run [1/1]: show its place in the leaderboard
            say(line.replace("[1/1] " + item.config.name, where))

        try:
            execute([item], say=say_where, kept=kept)
        except TrainingDiverged as err:
            diverged.record(item, str(err))
            say(f"{where}: diverged: {err}")


def _stats(planned: list[PlannedRun], entry: Entry, diverged: Diverged) -> dict | None:
    """The finished seeds of one entry in one setting: per seed, final and best-round mean accuracy (points), p10,
    Jain's index, seconds per round; None before any seed has finished."""
    per_seed, failed = [], [why for why in map(diverged.of, planned) if why]
    for item in planned:
        summary = read_summary(item.folder)
        if summary is None or entry.metric not in summary:
            continue
        final, best = summary[entry.metric], summary["best_round"][entry.metric]
        per_seed.append({"final": 100 * final["mean"], "best": 100 * best["mean"], "best_round": best["round"],
                         "p10": 100 * final["p10"], "jain": final["jain"],
                         "seconds": run_seconds(item.folder) / item.config.train.rounds,
                         "picked_on": best.get("picked_on", "test")})  # a summary from before validation: on test
    if not per_seed:
        return {"seeds": 0, "diverged": failed} if failed else None
    column = {key: [s[key] for s in per_seed] for key in per_seed[0]}
    return {"seeds": len(per_seed), "diverged": failed, "final": mean_ci(column["final"]).__dict__, "best": mean_ci(column["best"]).__dict__,
            "best_on": "validation" if set(column["picked_on"]) == {"validation"} else "test",
            **{key: float(np.mean(column[key])) for key in ("best_round", "p10", "jain", "seconds")}}


def evaluate(planned: list[PlannedRun], kept: Path) -> dict:
    """Per setting and method, the statistics of its finished seeds (and why any seed diverged: ``kept``'s
    ledger)."""
    diverged = Diverged(kept)
    by_key: dict[str, list[PlannedRun]] = {}
    for item in planned:
        by_key.setdefault(item.key, []).append(item)
    table: dict[str, dict[str, dict[str, Any] | None]] = {}
    for setting in SETTINGS:
        table[setting] = {}
        for entry in ENTRIES:
            runs = by_key.get(run_key(setting, entry), [])
            table[setting][entry.method] = _stats(runs, entry, diverged) if runs else None
    return table


def _interval(est: dict) -> str:
    if est["low"] is None:
        return f"{est['mean']:.2f}"
    return f"{est['mean']:.2f} ± {(est['high'] - est['low']) / 2:.2f}"


def _row(entry: Entry, stats: dict | None, column: int) -> str:
    pfl = PFLLIB_NUMBERS.get(entry.pfllib, ("-", "-"))[column] if entry.pfllib else "-"
    what = "personalized (fine-tuned)" if entry.metric == "acc_personalized" else "own model"
    if entry.pfllib_scores:
        what += f"; PFLlib's % scores the {entry.pfllib_scores}"
    if stats is None:
        return f"| `{entry.method}` | {what} | not run yet | | | | | | | {pfl} |"
    failed = f" ({len(stats['diverged'])} diverged: {stats['diverged'][0]})" if stats["diverged"] else ""
    if not stats["seeds"]:
        return f"| `{entry.method}` | {what} | diverged{failed} | | | | | | 0 | {pfl} |"
    on_test = "" if stats.get("best_on") == "validation" else " (on test)"
    return (f"| `{entry.method}` | {what} | {_interval(stats['final'])} | {_interval(stats['best'])}{on_test} | "
            f"{stats['best_round']:.0f} | {stats['p10']:.2f} | {stats['jain']:.3f} | {stats['seconds']:.2f} | "
            f"{stats['seeds']}{failed} | {pfl} |")


def render(table: dict, scale: str, planned: list[PlannedRun], command: str) -> str:
    cfg = planned[0].config if planned else None
    done = sum(read_summary(p.folder) is not None for p in planned)
    seconds = sum(run_seconds(p.folder) for p in planned if (p.folder / runfiles.ROUNDS).exists())
    lines = [f"# Leaderboard ({scale} scale)", "",
             f"Generated by `{command}` from {done} of {len(planned)} finished run folders ({seconds / 3600:.1f} h of "
             "rounds measured on this machine). Do not edit by hand: run the command again.", ""]
    if cfg is not None:
        t = cfg.train
        lines += [f"fedsim's protocol here: {cfg.data.num_clients} clients, f = {t.fraction:g}, {cfg.model.name} "
                  f"(model.batchnorm {cfg.model.batchnorm}), {t.rounds} rounds of {t.local_epochs} local epoch(s), "
                  f"batch {t.batch_size}, SGD lr {t.body.lr:g} momentum {t.body.momentum:g}, "
                  f"data.train_fraction {cfg.data.train_fraction:g} / test_fraction {cfg.data.test_fraction:g} of "
                  "CIFAR-100's own train / test sets; accuracy = the mean over clients of each client's accuracy on "
                  "its own test images, evaluated every "
                  f"{t.eval_every} rounds. Each cell: mean over seeds ± the half-width of its Student-t 95% interval. "
                  "s / round is the rounds' measured time (training, aggregation, evaluation) on the machine that ran "
                  "them, averaged over seeds: it compares methods only as far as their runs met the same load.",
                  "", f"{PFLLIB_PROTOCOL}. PFLlib's numbers are printed beside fedsim's for orientation only: the "
                  "protocols differ (model, rounds, split, pooled vs per-client mean), so the columns are not "
                  "a like-for-like comparison. PFLlib's number is its best round on test; fedsim's best round is picked "
                  "on the runs' validation split (data.validation) where they have one, and a cell marked (on test) "
                  "is the best round on test, as PFLlib's: a number to compare with theirs, not a selection.", ""]
    for column, setting in enumerate(SETTINGS):
        lines += [f"## {SETTING_TITLES[setting]}", "",
                  "| method | accuracy of | final round % | best round % | best at round | p10 % (final) | Jain (final) "
                  "| s / round | seeds | PFLlib % (best on test) |", "|" + "---|" * 10]
        lines += [_row(entry, table[setting][entry.method], column) for entry in ENTRIES]
        lines += ["", *_receipts(setting, planned), ""]
    return "\n".join(lines)


def _receipts(setting: str, planned: list[PlannedRun]) -> list[str]:
    """Each method's receipt in one setting, from the configs its seeds run (or ran) with."""
    arms = []
    for entry in ENTRIES:
        configs = [p.config.model_dump() for p in planned if p.key == run_key(setting, entry)]
        if configs:
            arms.append((f"`{entry.method}`", receipt(configs, [entry.metric])))
    return ["Receipt (each method's runs, from their configs):", "", *receipt_table(arms)] if arms else []


def write(table: dict, scale: str, planned: list[PlannedRun], command: str, report: Path) -> list[Path]:
    report.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(report, render(table, scale, planned, command))
    results = report.with_suffix(".json")
    atomic.write_text(results, json.dumps({"scale": scale, "command": command, "table": table}, indent=1))
    return [report, results]
