"""What the leaderboard's finals say beyond their last round, computed from their run folders: whether the order
still moves when the budget ends (each row's accuracy and rank at rounds R/2, 3R/4 and R, Kendall's tau between the
last two, each row's last-quarter gain), which rows the data separate (groups: each group's first and the rows
Holm's step-down test does not separate from it), and what each row costs (training sample-steps per client and
round) with the ranking at equal compute. Nothing here reads validation or chooses: the finals' test accuracy is
the reported quantity, read at rounds fixed before any run."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedsim.algorithms import build_algorithm
from fedsim.config import RunConfig
from fedsim.core import runfiles
from fedsim.metrics.confidence import holm, paired_p_value, simultaneous_ci
from fedsim.metrics.logger import read_jsonl

SEPARATED_AT = 0.05  # family-wise, per group's comparisons (Holm)
STABLE_TAU = 0.9  # Kendall's tau between the orders at 3R/4 and R the ranking is called stable at


def curve(folder: Path, metric: str) -> dict[int, float]:
    """Per evaluated round, the mean over clients of ``metric`` (percent)."""
    per_round: dict[int, list[float]] = {}
    for row in read_jsonl(folder / runfiles.METRICS):
        if metric in row:
            per_round.setdefault(row["round"], []).append(row[metric])
    return {r: 100 * float(np.mean(values)) for r, values in sorted(per_round.items())}


def mean_train_images(folder: Path) -> float:
    """The clients' mean number of training images (the metric rows' ``n_train``, one per client)."""
    sizes = {row["client"]: row["n_train"] for row in read_jsonl(folder / runfiles.METRICS) if "n_train" in row}
    return float(np.mean(list(sizes.values()))) if sizes else 0.0


def pooled_best_on_test(folder: Path, metric: str) -> float | None:
    """PFLlib's quantity from a finished run's per-client rows: per evaluated round the accuracy pooled over
    clients (each client's accuracy weighted by its test images), and the highest over rounds (percent)."""
    correct: dict[int, float] = {}
    images: dict[int, float] = {}
    for row in read_jsonl(folder / runfiles.METRICS):
        if metric in row and "n_test" in row:
            correct[row["round"]] = correct.get(row["round"], 0.0) + row[metric] * row["n_test"]
            images[row["round"]] = images.get(row["round"], 0.0) + row["n_test"]
    pooled = [correct[r] / images[r] for r in correct if images[r]]
    return 100 * max(pooled) if pooled else None


def training_cost(cfg: RunConfig, images: float) -> float:
    """Training sample-steps per client per round: its images times the passes the method makes over them (the
    method's extra epochs, FedRep's head epochs, Ditto's personal model, pFedMe's K, counted by the method)."""
    return images * build_algorithm(cfg).epochs_per_round(cfg.train.local_epochs)


def finetune_cost(cfg: RunConfig, images: float) -> float:
    """Fine-tuning sample-steps per client per evaluation (eval.finetune_epochs over its training images)."""
    return images * cfg.eval.finetune_epochs


def marks(rounds: int, evaluated: list[int]) -> dict[str, int]:
    """Rounds R/2, 3R/4 and R, each the last evaluated round at or before it."""
    out = {}
    for label, at in (("R/2", rounds / 2), ("3R/4", 3 * rounds / 4), ("R", rounds)):
        before = [r for r in evaluated if r <= at]
        if before:
            out[label] = max(before)
    return out


def _ranks(values: dict[str, float]) -> dict[str, int]:
    order = sorted(values, key=lambda m: -values[m])
    return {m: i for i, m in enumerate(order, start=1)}


def stability(curves: dict[str, dict[int, float]], at: dict[str, int]) -> dict[str, Any]:
    """Each row's accuracy and rank at the marks, its last-quarter gain, Kendall's tau between the orders at 3R/4
    and R, and the pairs whose order flips over the last quarter."""
    from scipy import stats

    rows = sorted(curves)
    levels = {label: {m: curves[m][r] for m in rows if r in curves[m]} for label, r in at.items()}
    ranks = {label: _ranks(values) for label, values in levels.items()}
    out: dict[str, Any] = {"marks": at, "levels": levels, "ranks": ranks, "tau": None, "moving": [], "gain": {}}
    if "3R/4" not in levels or len(levels["3R/4"]) < 2 or len(levels["R"]) != len(levels["3R/4"]):
        return out
    late, last = levels["3R/4"], levels["R"]
    out["gain"] = {m: last[m] - late[m] for m in rows}
    tau = stats.kendalltau([late[m] for m in rows], [last[m] for m in rows]).statistic
    out["tau"] = float(tau)
    out["moving"] = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]
                     if (late[a] - late[b]) * (last[a] - last[b]) < 0]
    return out


def groups(by_seed: dict[str, dict[int, float]]) -> dict[str, Any]:
    """The rows in groups the data do not separate: the best remaining row leads a group; every remaining row whose
    paired difference to it (over the same seeds) Holm's test does not reject at 5% family-wise joins it; repeat.
    Each row's difference to its group's first has a Bonferroni interval (95% jointly over that step's comparisons)
    and its Holm-adjusted p-value."""
    means = {m: float(np.mean(list(seeds.values()))) for m, seeds in by_seed.items()}
    left = sorted(means, key=lambda m: -means[m])
    found: list[list[str]] = []
    versus: dict[str, dict[str, Any]] = {}
    while left:
        first, rest = left[0], left[1:]
        diffs = {m: [by_seed[first][s] - by_seed[m][s] for s in sorted(by_seed[m])] for m in rest}
        adjusted = holm({m: paired_p_value(d) for m, d in diffs.items()})
        for m in rest:
            versus[m] = {"first": first, "p_holm": adjusted[m],
                         "difference": simultaneous_ci(diffs[m], len(rest)).__dict__}
        group = [first, *(m for m in rest if adjusted[m] >= SEPARATED_AT)]
        found.append(group)
        left = [m for m in left if m not in group]
    return {"groups": found, "versus": versus}


def equal_compute(curves: dict[str, dict[int, float]], costs: dict[str, float], rounds: int) -> dict[str, Any]:
    """Each row's accuracy at the budget of the cheapest row's ``rounds`` rounds: at the last evaluated round whose
    training sample-steps stay within it (None where even the first evaluated round costs more)."""
    budget = min(costs.values()) * rounds
    at: dict[str, int | None] = {}
    level: dict[str, float | None] = {}
    for m, points in curves.items():
        within = [r for r in points if r * costs[m] <= budget * (1 + 1e-9)]
        at[m] = max(within) if within else None
        level[m] = points[max(within)] if within else None
    scored = {m: v for m, v in level.items() if v is not None}
    return {"budget": budget, "round": at, "level": level, "ranks": _ranks(scored)}
