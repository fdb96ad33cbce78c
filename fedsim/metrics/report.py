"""Fairness report over run folders: accuracy spread across clients per round, final distributions,
communication totals, and a Markdown summary linking the figures."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedsim import strict_yaml
from fedsim.config import result_settings
from fedsim.core import runfiles
from fedsim.core.protocol import ACCURACIES, logged_keys
from fedsim.core.results import read_results
from fedsim.metrics.confidence import Estimate, mean_ci
from fedsim.metrics.summary import summarize

MB = 1e6
DIRECTIONS = ("bytes_up", "bytes_down")


@dataclass(frozen=True)
class Run:
    name: str
    algorithm: str
    rounds: int
    finished: bool
    wall_seconds: float | None
    per_round: dict[str, dict[int, list[float]]]  # kind -> evaluation round -> per-client values
    comm: dict[str, int | None]  # total bytes per direction; None where the run did not record it
    seed: int | None = None
    settings: str = ""  # every setting that changes results except the seed: runs that share it are seeds of one
    logged: dict[str, list[float]] = field(default_factory=dict)  # a user module's self.log values, last round
    sim_time: dict[int, float] = field(default_factory=dict)  # round -> simulated seconds at its end (system.devices)
    system: dict = field(default_factory=dict)  # summary.json's system block: totals, fairness by device class

    def curve(self, kind: str) -> tuple[list[int], list[dict[str, float]]]:
        rounds = sorted(self.per_round[kind])
        return rounds, [summarize(self.per_round[kind][r]) for r in rounds]

    def final(self, kind: str) -> list[float]:
        return self.per_round[kind][max(self.per_round[kind])]


def _read(path: Path, load: Callable[[str], Any]) -> dict:
    """A run folder's JSON or YAML file as a mapping ({} when absent); anything else is a one-line error."""
    if not path.exists():
        return {}
    try:
        value = load(path.read_text()) or {}
    except (ValueError, UnicodeDecodeError) as err:  # json's and strict_yaml's errors are ValueErrors
        raise ValueError(f"{path}: unreadable ({str(err).splitlines()[0]}); restore it or leave it out") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: holds a {type(value).__name__}, not a mapping; restore it or leave it out")
    return value


def _checked_records(path: Path) -> list[dict]:
    """metrics.jsonl's rows, each a client record with a round, a client and accuracies in [0, 1]: a torn last
    line is the run still writing (left out); anything else is a one-line error naming file and line."""
    records = read_results(path)
    for number, rec in enumerate(records, start=1):
        bad = [k for k in ACCURACIES if k in rec and not (isinstance(rec[k], (int, float)) and not isinstance(rec[k], bool)
                                                           and 0 <= rec[k] <= 1)]
        if type(rec.get("client")) is not int or bad:
            raise ValueError(f"{path}:{number}: not a client record ({'its ' + bad[0] if bad else 'no client'} is "
                             f"{rec.get(bad[0]) if bad else rec.get('client')!r}); restore the file from the run")
    return records


def load_run(run_dir: Path) -> Run:
    """Read a run folder; curves come from metrics.jsonl so every statistic is computed by `summarize`,
    also for runs written before it reported p10/worst10/jain, and for runs still in progress. Every file is
    checked as it is read: a damaged one is a one-line error, never a wrong table."""
    records = _checked_records(run_dir / runfiles.METRICS)
    if not records:
        raise ValueError(f"{run_dir}: no client metrics (metrics.jsonl missing or empty: not a run folder, or no "
                         "evaluation round has finished yet)")
    summary, config = _read(run_dir / runfiles.SUMMARY, json.loads), _read(run_dir / runfiles.CONFIG, strict_yaml.load)
    per_round: dict[str, dict[int, list[float]]] = {}
    for rec in records:
        for kind in ACCURACIES:
            if rec.get(kind) is not None:
                per_round.setdefault(kind, {}).setdefault(rec["round"], []).append(rec[kind])
    last = max(rec["round"] for rec in records)
    final = [rec for rec in records if rec["round"] == last]
    logged = {key: [rec[key] for rec in final if rec.get(key) is not None] for key in logged_keys(final)}
    rows = read_results(run_dir / runfiles.ROUNDS)
    # Older runs lack summary["comm"] and bytes_down; fall back to the per-round rows, else None.
    comm = summary.get("comm") or {d: sum(r[d] for r in rows if d in r) if any(d in r for r in rows) else None
                                   for d in DIRECTIONS}
    return Run(name=summary.get("name", run_dir.name), algorithm=summary.get("algorithm", config.get("algorithm", "?")),
               rounds=summary.get("rounds", max(r["round"] for r in rows + records)), finished=bool(summary),
               wall_seconds=summary.get("wall_seconds"), per_round=per_round,
               comm={d: comm.get(d) for d in DIRECTIONS}, seed=config.get("seed"), settings=_settings(config),
               logged=logged, sim_time={r["round"]: r["sim_time_s"] for r in rows if "sim_time_s" in r},
               system=summary.get("system", {}))


def _settings(config: dict) -> str:
    """Every setting that changes what the run computes, except the seed: runs that share it are seeds of one.
    A config.yaml from an older fedsim (sections missing) is compared as written."""
    settings = result_settings({**config, "engine": config.get("engine", {})})
    return json.dumps({k: v for k, v in settings.items() if k != "seed"}, sort_keys=True, default=str)


def seed_groups(runs: list[Run]) -> list[list[Run]]:
    """Runs that differ only in seed, grouped (groups of two or more, in the order their first run came)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.settings, []).append(run)
    return [g for g in groups.values() if len(g) > 1 and len({r.seed for r in g}) == len(g)]


def group_label(group: list[Run]) -> str:
    """The runs' common name prefix (``fedper-k4-s0``, ``fedper-k4-s1`` -> ``fedper-k4``), else the first name."""
    prefix = re.sub(r"[-_.]+(s|seed)?$", "", os.path.commonprefix([run.name for run in group]))
    return prefix or group[0].name


def seed_curve(group: list[Run], kind: str) -> tuple[list[int], list[Estimate]]:
    """Per evaluation round that every seed reached: the mean over seeds of the client-mean accuracy (in
    points) with its 95% interval."""
    rounds = sorted(set.intersection(*(set(run.per_round.get(kind, {})) for run in group)))
    return rounds, [mean_ci([100 * float(np.mean(run.per_round[kind][r])) for run in group]) for r in rounds]


def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def _pct(stats: list[dict[str, float]], key: str) -> np.ndarray:
    return 100 * np.array([s[key] for s in stats])


def _style(ax: Axes, title: str) -> None:
    ax.set(xlabel="round", ylabel="client accuracy (%)", title=title, ylim=(0, 100))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # outside: never hides a curve


def _fairness_png(run: Run, path: Path) -> None:
    kinds = list(run.per_round)
    fig = Figure(figsize=(7.4 * len(kinds), 4.4), layout="constrained")
    for ax, kind in zip(fig.subplots(1, len(kinds), squeeze=False)[0], kinds):
        rounds, stats = run.curve(kind)
        mean, std = _pct(stats, "mean"), _pct(stats, "std")
        ax.plot(rounds, mean, marker="o", color="C0", label="mean")
        ax.fill_between(rounds, mean - std, mean + std, color="C0", alpha=0.2, label="mean ± std")
        ax.plot(rounds, _pct(stats, "p10"), "--", color="C1", label="p10")
        ax.plot(rounds, _pct(stats, "min"), ":", color="C3", label="min")
        _style(ax, f"{ACCURACIES[kind]} accuracy")
    fig.suptitle(f"{run.name} ({run.algorithm}): accuracy across clients per round")
    fig.savefig(path, dpi=110)


def _comparison_png(runs: list[Run], path: Path) -> None:
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


def _distribution_png(runs: list[Run], path: Path) -> None:
    entries = [(run.name if kind == "acc" else f"{run.name}\n({ACCURACIES[kind]})", 100 * np.array(run.final(kind)))
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


def _seeds_png(groups: list[list[Run]], path: Path) -> None:
    kinds = [k for k in ACCURACIES if any(k in run.per_round for g in groups for run in g)]
    fig = Figure(figsize=(7.4 * len(kinds), 4.6), layout="constrained")
    for ax, kind in zip(fig.subplots(1, len(kinds), squeeze=False)[0], kinds):
        for i, group in enumerate(groups):
            rounds, estimates = seed_curve(group, kind)
            if not rounds:
                continue
            mean = np.array([e.mean for e in estimates])
            ax.plot(rounds, mean, marker="o", markersize=3, color=f"C{i % 10}",
                    label=f"{group_label(group)} ({len(group)} seeds)")
            if all(e.low is not None for e in estimates):
                ax.fill_between(rounds, [e.low for e in estimates], [e.high for e in estimates], color=f"C{i % 10}",
                                alpha=0.2)
        _style(ax, f"{ACCURACIES[kind]} accuracy: mean over seeds (band: 95% CI)")
    fig.savefig(path, dpi=110)


def _seed_table(groups: list[list[Run]]) -> list[str]:
    lines = ["| runs | seeds | accuracy | final mean % [95% CI over seeds] | mean client std |", "|---|---|---|---|---|"]
    for group in groups:
        for kind in ACCURACIES:
            rounds, estimates = seed_curve(group, kind)
            if rounds:
                est = estimates[-1]
                interval = f"{est.mean:.2f}" + (f" [{est.low:.2f}, {est.high:.2f}]" if est.low is not None else "")
                spread = np.mean([100 * summarize(run.per_round[kind][rounds[-1]])["std"] for run in group])
                lines.append(f"| {group_label(group)} | {', '.join(str(r.seed) for r in group)} | {ACCURACIES[kind]} | "
                             f"{interval} | {spread:.2f} |")
    return lines


def _communication_png(runs: list[Run], path: Path) -> None:
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


def _time_png(runs: list[Run], path: Path) -> None:
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


def _device_table(runs: list[Run]) -> list[str]:
    """Final-round accuracy by device class and by participation, from each run's summary."""
    lines = ["| run | accuracy | by | group | clients' mean % | p10 % | min % |", "|" + "---|" * 7]
    for run in runs:
        for by in ("device", "participation"):
            for kind, groups in run.system.get(f"by_{by}", {}).items():
                for group, s in groups.items():
                    lines.append(f"| {run.name} | {ACCURACIES[kind]} | {by} | {group} | {100 * s['mean']:.2f} | "
                                 f"{100 * s['p10']:.2f} | {100 * s['min']:.2f} |")
    return lines


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, spec)


def _accuracy_table(runs: list[Run]) -> list[str]:
    header = "run | algorithm | rounds | accuracy | mean % | std | min % | p10 % | worst10 % | Jain | MB up | MB down"
    lines = [f"| {header} | wall s |", "|" + "---|" * 13]
    for run in runs:
        rounds = f"{run.rounds}" + ("" if run.finished else " (no summary.json)")
        for kind in run.per_round:
            s = summarize(run.final(kind))
            lines.append(f"| {run.name} | {run.algorithm} | {rounds} | {ACCURACIES[kind]} | {100 * s['mean']:.2f} | "
                         f"{100 * s['std']:.2f} | {100 * s['min']:.2f} | {100 * s['p10']:.2f} | "
                         f"{100 * s['worst10_mean']:.2f} | {s['jain']:.3f} | {_fmt(run.comm['bytes_up'], '.2f', MB)} | "
                         f"{_fmt(run.comm['bytes_down'], '.2f', MB)} | {_fmt(run.wall_seconds, '.1f')} |")
    return lines


def _logged_table(runs: list[Run]) -> list[str]:
    """What the runs' own modules logged (self.log), across clients at the last evaluated round, in their units."""
    lines = ["| run | logged | clients | mean | std | min | p10 | worst10 | Jain |", "|" + "---|" * 9]
    for run in runs:
        for key, values in run.logged.items():
            s = summarize(values)
            lines.append(f"| {run.name} | {key} | {len(values)} | {s['mean']:.4g} | {s['std']:.4g} | {s['min']:.4g} | "
                         f"{s['p10']:.4g} | {s['worst10_mean']:.4g} | {s['jain']:.3f} |")
    return lines


def _saving_lines(runs: list[Run]) -> list[str]:
    """Saving of each run against the run that sent the most, over the directions every run recorded
    (older runs have no bytes_down, and comparing up+down against up alone would invent a saving)."""
    directions = [d for d in DIRECTIONS if all(run.comm[d] is not None for run in runs)]
    totals = [sum(run.comm[d] or 0 for d in directions) for run in runs]
    if not directions or max(totals) == 0:
        return []
    ref = runs[int(np.argmax(totals))]
    lines = [f"Compared on {' + '.join(d.replace('_', ' ') for d in directions)}; reference: {ref.name} "
             "(the run that sent the most).", "", f"| run | MB compared | saving vs {ref.name} |", "|---|---|---|"]
    for run, total in zip(runs, totals):
        saving = "reference" if run is ref else f"{100 * (1 - total / max(totals)):.2f}%"
        lines.append(f"| {run.name} | {total / MB:.2f} | {saving} |")
    return lines


def write_report(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Write fairness_<run>.png per run, comparison.png, final_distribution.png, communication.png (when runs
    recorded bytes), sim_time.png (when runs ran on the virtual clock) and report.md into out_dir; return the
    written paths."""
    if not run_dirs:
        raise ValueError("write_report needs at least one run folder")
    runs = [load_run(Path(d)) for d in run_dirs]
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        raise ValueError(f"run names must differ (figures are named after them): {names}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(draw: Callable[..., None], filename: str, *args: Any) -> str:
        draw(*args, out_dir / filename)
        written.append(out_dir / filename)
        return filename

    md = ["# Fairness report", "", "## Final client accuracy", "", *_accuracy_table(runs), "",
          "std in percentage points; p10 = 10th percentile over clients; worst10 = mean of the worst 10% of clients "
          "(at least one); Jain = (sum x)^2 / (n sum x^2), 1 = all clients equal; MB = 10^6 bytes in total.", "",
          f"![comparison]({save(_comparison_png, 'comparison.png', runs)})", "",
          f"![final distribution]({save(_distribution_png, 'final_distribution.png', runs)})", ""]
    groups = seed_groups(runs)
    if groups:
        md += ["## Across seeds", "", "Runs whose settings differ only in seed, grouped: the mean over seeds of the "
               "client-mean accuracy at the last round all seeds reached, with a Student-t 95% interval.", "",
               *_seed_table(groups), "", f"![across seeds]({save(_seeds_png, 'seeds.png', groups)})", ""]
    if any(run.logged for run in runs):
        md += ["## Logged by the modules", "", "What each run's LightningModule logged with self.log, per client at the "
               "last evaluated round (training values: the clients trained that round).", "", *_logged_table(runs), ""]
    with_comm = [run for run in runs if any(v is not None for v in run.comm.values())]
    if with_comm:
        md += ["## Communication", "", *_saving_lines(with_comm), "",
               f"![communication]({save(_communication_png, 'communication.png', with_comm)})", ""]
    timed = [run for run in runs if run.sim_time]
    if timed:
        totals = [f"{run.name}: {run.system.get('sim_seconds', max(run.sim_time.values())):.0f} s simulated, "
                  f"{run.system.get('dropouts', '-')} dropouts, {run.system.get('late', '-')} late reports"
                  for run in timed]
        md += ["## On the virtual clock", "", "; ".join(totals) + ".", "",
               f"![accuracy against simulated time]({save(_time_png, 'sim_time.png', timed)})", "",
               *_device_table(timed), ""]
    md += ["## Per run", ""]
    for run in runs:
        png = save(_fairness_png, f"fairness_{_slug(run.name)}.png", run)
        md += [f"### {run.name}", "", f"![fairness {run.name}]({png})", ""]
    (out_dir / "report.md").write_text("\n".join(md))
    return [*written, out_dir / "report.md"]
