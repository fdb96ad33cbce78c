"""The fairness report's Markdown tables: final client accuracy, across seeds, what the modules logged, by device
class, and the communication saving."""
from __future__ import annotations

import numpy as np

from fedsim.core.protocol import ACCURACIES, SCORED, lower_is_better
from fedsim.metrics.logger import best_rounds
from fedsim.metrics.report_runs import DIRECTIONS, MB, Run, group_label, seed_curve
from fedsim.metrics.summary import summarize, times_to_accuracy
from fedsim.privacy import EPSILON, EPSILON_MEDIAN


def seed_table(groups: list[list[Run]]) -> list[str]:
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


def device_table(runs: list[Run]) -> list[str]:
    """Final-round accuracy by device class and by participation, from each run's summary."""
    lines = ["| run | accuracy | by | group | clients' mean % | p10 % | min % |", "|" + "---|" * 7]
    for run in runs:
        for by in ("device", "participation"):
            for kind, groups in run.system.get(f"by_{by}", {}).items():
                for group, s in groups.items():
                    lines.append(f"| {run.name} | {ACCURACIES[kind]} | {by} | {group} | {100 * s['mean']:.2f} | "
                                 f"{100 * s['p10']:.2f} | {100 * s['min']:.2f} |")
    return lines


def time_to_accuracy_table(runs: list[Run]) -> list[str]:
    """When each run's clients' mean first reached each system.target_accuracy, in simulated seconds."""
    lines = ["| run | accuracy | target % | simulated s |", "|" + "---|" * 4]
    for run in runs:
        for kind, target, seconds in times_to_accuracy(run.system):
            lines.append(f"| {run.name} | {ACCURACIES.get(kind, kind)} | {100 * target:g} | "
                         f"{'never reached' if seconds is None else f'{seconds:.1f}'} |")
    return lines


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, spec)


def accuracy_table(runs: list[Run]) -> list[str]:
    header = "run | algorithm | rounds | accuracy | mean % | std | min % | p10 % | worst10 % | Jain | MB up | MB down"
    lines = [f"| {header} | wall s |", "|" + "---|" * 13]
    for run in runs:
        rounds = f"{run.rounds}" + ("" if run.finished else " (no summary.json)")
        for kind in run.per_round:
            s = summarize(run.final(kind))
            lines.append(f"| {run.name} | {run.algorithm} | {rounds} | {SCORED[kind]} | {100 * s['mean']:.2f} | "
                         f"{100 * s['std']:.2f} | {100 * s['min']:.2f} | {100 * s['p10']:.2f} | "
                         f"{100 * s['worst10_mean']:.2f} | {s['jain']:.3f} | {_fmt(run.comm['bytes_up'], '.2f', MB)} | "
                         f"{_fmt(run.comm['bytes_down'], '.2f', MB)} | {_fmt(run.wall_seconds, '.1f')} |")
    return lines


def logged_table(runs: list[Run]) -> list[str]:
    """What the runs' own modules logged (self.log), across clients at the last evaluated round, in their units."""
    lines = ["| run | logged | clients | mean | std | min | p10 | worst10 | Jain |", "|" + "---|" * 9]
    for run in runs:
        for key, values in run.logged.items():
            s = summarize(values, lower_is_better(key))
            lines.append(f"| {run.name} | {key} | {len(values)} | {s['mean']:.4g} | {s['std']:.4g} | {s['min']:.4g} | "
                         f"{s['p10']:.4g} | {s['worst10_mean']:.4g} | {s['jain']:.3f} |")
    return lines


def mechanism_table(runs: list[Run]) -> list[str]:
    """Each run's server-side mechanism quantities (rounds.jsonl's ``mechanism``: FedAMP's self-weights, IFCA's
    cluster sizes) at the first and the last round that recorded them."""
    lines = ["| run | quantity | first round | value | last round | value |", "|" + "---|" * 6]
    for run in runs:
        for key, by_round in run.mechanism.items():
            first, last = min(by_round), max(by_round)
            lines.append(f"| {run.name} | {key} | {first} | {by_round[first]:.4g} | {last} | {by_round[last]:.4g} |")
    return lines


def privacy_table(runs: list[Run]) -> list[str]:
    """Each DP run's epsilon at its last recorded round (rounds.jsonl: a run in progress too), with what it means
    from summary.json (delta, noise multiplier, accountant, sampling; "-" until the run finishes)."""
    lines = ["| run | DP | round | epsilon | median client's | delta | noise multiplier | accountant | sampling (q) |",
             "|" + "---|" * 9]
    for run in runs:
        if not run.spent:
            continue
        last = max(run.spent)
        spent, p = run.spent[last], run.privacy
        median = spent.get(EPSILON_MEDIAN)
        sampling = f"{p['sampling']} ({p['q']:.4g})" if p else "-"
        lines.append(f"| {run.name} | {p.get('dp', '-')} | {last} | {spent[EPSILON]:.4g} | "
                     f"{_fmt(median, '.4g')} | {_fmt(p.get('delta'), '.3g')} | {_fmt(p.get('noise_multiplier'), '.4g')} | "
                     f"{p.get('accountant', '-')} | {sampling} |")
    return lines


def saving_lines(runs: list[Run]) -> list[str]:
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


def selection_table(runs: list[Run]) -> list[str]:
    """Per run and accuracy, the round its validation split picks (``best_rounds``, as summary.json's best_round) and
    test's client mean there and at the final round. A run without validation data has no round picked: its best
    round on test is shown as what it is (the number PFLlib reports), never as a selection."""
    lines = ["| run | accuracy | round | picked on | test at that round % | test at the final round % |",
             "|" + "---|" * 6]
    for run in runs:
        rounds = sorted({r for values in run.per_round.values() for r in values})
        rows = [{"round": r, **{kind: summarize(by_round[r]) for kind, by_round in run.per_round.items() if r in by_round}}
                for r in rounds]
        for kind, best in best_rounds(rows).items():
            how = "validation" if best["picked_on"] == "validation" else "best on test, as PFLlib reports; not a selection"
            lines.append(f"| {run.name} | {ACCURACIES[kind]} | {best['round']} | {how} | {100 * best['mean']:.2f} | "
                         f"{100 * summarize(run.final(kind))['mean']:.2f} |")
    return lines
