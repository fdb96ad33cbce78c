"""The fairness report's figures: accuracy across clients per round, the final distribution, seeds, communication
and simulated time, each drawn from loaded runs into one PNG."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsim.core.protocol import ACCURACIES, SCORED
from fedsim.metrics.report_runs import DIRECTIONS, MB, Run, group_label, seed_curve


def _pct(stats: list[dict[str, float]], key: str) -> np.ndarray:
    return 100 * np.array([s[key] for s in stats])


def _style(ax: Axes, title: str) -> None:
    ax.set(xlabel="round", ylabel="client accuracy (%)", title=title, ylim=(0, 100))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # outside: never hides a curve


def fairness_png(run: Run, path: Path) -> None:
    kinds = list(run.per_round)
    fig = Figure(figsize=(7.4 * len(kinds), 4.4), layout="constrained")
    for ax, kind in zip(fig.subplots(1, len(kinds), squeeze=False)[0], kinds):
        rounds, stats = run.curve(kind)
        mean, std = _pct(stats, "mean"), _pct(stats, "std")
        ax.plot(rounds, mean, marker="o", color="C0", label="mean")
        ax.fill_between(rounds, mean - std, mean + std, color="C0", alpha=0.2, label="mean ± std")
        ax.plot(rounds, _pct(stats, "p10"), "--", color="C1", label="p10")
        ax.plot(rounds, _pct(stats, "min"), ":", color="C3", label="min")
        _style(ax, f"{SCORED[kind]} accuracy")
    fig.suptitle(f"{run.name} ({run.algorithm}): accuracy across clients per round")
    fig.savefig(path, dpi=110)


def comparison_png(runs: list[Run], path: Path) -> None:
    fig = Figure(figsize=(9.5, 5), layout="constrained")
    ax = fig.subplots()
    for i, run in enumerate(runs):
        for kind, style in zip(ACCURACIES, ("-", "--")):
            if kind in run.per_round:
                rounds, stats = run.curve(kind)
                mean, std = _pct(stats, "mean"), _pct(stats, "std")
                label = run.name if kind == "acc" else f"{run.name} ({ACCURACIES[kind]})"
                ax.plot(rounds, mean, style, marker="o", markersize=3, color=f"C{i % 10}", label=label)
                ax.fill_between(rounds, mean - std, mean + std, color=f"C{i % 10}", alpha=0.15)
    _style(ax, "Mean client accuracy per round (band: ± std across clients)")
    fig.savefig(path, dpi=110)


def distribution_png(runs: list[Run], path: Path) -> None:
    entries = [(run.name if kind == "acc" else f"{run.name}\n({SCORED[kind]})", 100 * np.array(run.final(kind)))
               for run in runs for kind in run.per_round]
    fig = Figure(figsize=(max(6.0, 1.6 * len(entries)), 4.8), layout="constrained")
    ax = fig.subplots()
    positions = np.arange(1, len(entries) + 1)
    ax.boxplot([v for _, v in entries], positions=positions, widths=0.5, showmeans=True, showfliers=False,
               medianprops={"color": "black"}, meanprops={"markerfacecolor": "white", "markeredgecolor": "black"})
    jitter = np.random.default_rng(0)  # fixed seed: the same runs always give the same picture
    for pos, (_, values) in zip(positions, entries):
        ax.scatter(pos + jitter.uniform(-0.12, 0.12, values.size), values, s=16, alpha=0.7, zorder=3)
    ax.set_xticks(positions, [label for label, _ in entries], rotation=20 if len(entries) > 3 else 0)
    ax.set(ylabel="final client accuracy (%)", ylim=(0, 100))
    ax.set_title("Final per-client accuracy\n(box: quartiles, line: median, triangle: mean, dots: clients)",
                 fontsize="medium")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)


def seeds_png(groups: list[list[Run]], path: Path) -> None:
    kinds = [k for k in ACCURACIES if any(k in run.per_round for g in groups for run in g)]
    fig = Figure(figsize=(7.4 * len(kinds), 4.6), layout="constrained")
    for ax, kind in zip(fig.subplots(1, len(kinds), squeeze=False)[0], kinds):
        for i, group in enumerate(groups):
            rounds, estimates = seed_curve(group, kind)
            if not rounds:
                continue
            mean = np.array([e.mean for e in estimates])
            ax.plot(rounds, mean, marker="o", markersize=3, color=f"C{i % 10}",
                    label=f"{group_label(group)} ({len(group)} seed{'s' if len(group) > 1 else ''})")
            if all(e.low is not None for e in estimates):
                ax.fill_between(rounds, [e.low for e in estimates], [e.high for e in estimates], color=f"C{i % 10}",
                                alpha=0.2)
        _style(ax, f"{ACCURACIES[kind]} accuracy: mean over seeds (band: 95% CI)")
    fig.savefig(path, dpi=110)


def communication_png(runs: list[Run], path: Path) -> None:
    fig = Figure(figsize=(max(7.0, 1.5 * len(runs) + 1.5), 4.4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(runs))
    for offset, direction in zip((-0.2, 0.2), DIRECTIONS):
        values = [run.comm[direction] for run in runs]
        bars = ax.bar(x + offset, [(v or 0) / MB for v in values], width=0.4, label=direction.replace("_", " "))
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v / MB:.1f}" for v in values], fontsize="small")
    ax.set_xticks(x, [run.name for run in runs], rotation=20 if len(runs) > 3 else 0)
    ax.set(ylabel="total MB (10^6 bytes)", title="Communication per run")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.savefig(path, dpi=110)


def time_png(runs: list[Run], path: Path) -> None:
    """Mean client accuracy against simulated time: what a straggler or a dropout costs, which rounds hide."""
    fig = Figure(figsize=(8, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, run in enumerate(runs):
        for kind, style in zip(ACCURACIES, ("-", "--")):
            rounds = [r for r in sorted(run.per_round.get(kind, {})) if r in run.sim_time]
            if rounds:
                mean = [100 * float(np.mean(run.per_round[kind][r])) for r in rounds]
                ax.plot([run.sim_time[r] for r in rounds], mean, style, marker="o", markersize=3, color=f"C{i % 10}",
                        label=f"{run.name} ({ACCURACIES[kind]})")
    ax.set(xlabel="simulated time (s)", ylabel="mean client accuracy (%)", ylim=(0, 100),
           title="Mean client accuracy against simulated time")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.savefig(path, dpi=110)
