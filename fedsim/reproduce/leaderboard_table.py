"""The leaderboard's table, computed from the finished run folders of its plan (``leaderboard.plan``): per setting
and method, the settings its search chose (on validation) and its finals' test accuracy at the final round and at
the round validation picks, fairness across clients (p10, Jain) and time per round, each a mean over seeds with a
95% interval, and a ranking by the final round with each method's paired difference to the first; nothing is
selected on test. The one number read at the best round on test is the column beside
PFLlib's, because that is PFLlib's quantity (its best round on test of the accuracy pooled over clients,
serverbase.py evaluate()), and only in rows where PFLlib's number scores what the row reports."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedsim import atomic
from fedsim.algorithms import mechanism_state
from fedsim.core import runfiles
from fedsim.metrics.confidence import mean_ci
from fedsim.metrics.logger import read_jsonl
from fedsim.metrics.receipt import receipt, receipt_table
from fedsim.reproduce.leaderboard import Board, Diverged, Entry, Plan, Search, run_key
from fedsim.reproduce import leaderboard_stats as more
from fedsim.reproduce.leaderboard_figure import curves_figure
from fedsim.reproduce.leaderboard_ranking import ranking_lines
from fedsim.reproduce.paper_files import file_passages
from fedsim.reproduce.runner import PlannedRun, run_cpu_seconds, run_seconds
from fedsim.sweep.runs import status
from fedsim.sweep.tune import SELECTION, reported_key, space_text



def page(board: Board) -> dict[str, str]:
    """The board's page's own text around the tables (its ``page.md``)."""
    return file_passages(board.folder / "page.md")


def _seed_stats(item: PlannedRun, summary: dict, comparable: bool) -> dict[str, Any]:
    metric = reported_key(item.config)
    final, picked = summary[metric], summary["best_round"][metric]
    return {"seed": item.seed, "final": 100 * final["mean"], "picked": 100 * picked["mean"],
            "picked_round": picked["round"], "picked_on": picked.get("picked_on", "test"), "p10": 100 * final["p10"],
            "jain": final["jain"],
            "seconds": run_seconds(item.folder) / item.config.train.rounds,
            "cpu_seconds": None if (cpu := run_cpu_seconds(item.folder)) is None else cpu / item.config.train.rounds,
            "pooled_best": more.pooled_best_on_test(item.folder, metric) if comparable else None,
            "curve": more.curve(item.folder, metric), "images": more.mean_train_images(item.folder),
            "mechanism": _mechanism(item)}


def _mechanism(item: PlannedRun) -> dict[str, Any] | None:
    """The method's mechanism at the run's end (its value, and what the method is where it is off), or None for a
    method without one of its own."""
    cfg = item.config
    state = mechanism_state({"name": cfg.algorithm.name, **cfg.algorithm.params},
                            read_jsonl(item.folder / runfiles.ROUNDS))
    return None if state is None else {"value": state.value, "flag": state.flag}


def _stats(finals: list[PlannedRun], entry: Entry, diverged: Diverged) -> dict[str, Any]:
    """The finished seeds of one method's finals: means (and 95% intervals) of the final round's and the
    validation-picked round's accuracy (points), p10, Jain's index, seconds per round."""
    comparable = entry.pfllib is not None and entry.pfllib_scores is None
    per_seed = [_seed_stats(item, summary, comparable) for item in finals
                if (summary := item.result()) is not None]
    out: dict[str, Any] = {"seeds": len(per_seed), "planned": len(finals),
                           "diverged": [why for why in map(diverged.of, finals) if why]}
    if not per_seed:
        return out
    column = {key: [s[key] for s in per_seed] for key in per_seed[0]}
    cfg, images = finals[0].config, float(np.mean(column["images"]))
    common = set.intersection(*(set(c) for c in column["curve"]))
    out |= {"curve": {r: float(np.mean([c[r] for c in column["curve"]])) for r in sorted(common)},
            "cost": more.training_cost(cfg, images), "finetune_cost": more.finetune_cost(cfg, images)}
    out |= {"by_seed": dict(zip(column["seed"], column["final"])), "final": mean_ci(column["final"]).__dict__,
            "picked": mean_ci(column["picked"]).__dict__,
            "picked_on": sorted(set(column["picked_on"])), "picked_rounds": column["picked_round"],
            **{key: float(np.mean(column[key])) for key in ("p10", "jain", "seconds")},
            "cpu_seconds": None if None in column["cpu_seconds"] else float(np.mean(column["cpu_seconds"]))}
    states = [m for m in column["mechanism"] if m is not None]
    if states:
        flags = [m["flag"] for m in states if m["flag"]]
        out["mechanism"] = {"value": states[0]["value"], "flag": max(set(flags), key=flags.count) if flags else None,
                            "flagged": len(flags), "of": len(states)}
    if comparable and None not in column["pooled_best"]:
        out["pooled_best"] = mean_ci(column["pooled_best"]).__dict__
    return out


def _tuning(search: Search, diverged: Diverged) -> dict[str, Any]:
    # Read from the record, not the choice, so a trial that diverged is named while the search still runs.
    stopped = [[bool(diverged.of(i)) for i in trial] for trial in search.runs]
    done = sum(all(i.result() is not None or gone for i, gone in zip(trial, flags))
               for trial, flags in zip(search.runs, stopped))
    failed_trials = [k for k, flags in enumerate(stopped) if any(flags)]
    out: dict[str, Any] = {"space": space_text(search.own), "trials_done": done, "trials": len(search.runs),
                           "first": search.first,
                           "failed": search.failed, "failed_trials": failed_trials,
                           "runs_diverged": sum(map(sum, stopped))}
    if search.choice is not None:
        out |= {"trial": search.trial_name(search.choice.trial), "validation": 100 * search.choice.score,
                "chosen": search.trials[search.choice.trial]}
    return out


def evaluate(full: Plan, kept: Path) -> dict:
    """Per setting and method: its search (space, progress, choice) and its finals' statistics."""
    diverged = Diverged(kept)
    table: dict[str, dict[str, dict[str, Any]]] = {setting: {} for setting in full.board.settings}
    for search in full.searches:
        finals = [p for p in full.finals if p.key == run_key(search.setting, search.entry)]
        table[search.setting][search.entry.name] = {"tuning": _tuning(search, diverged),
                                                      "finals": _stats(finals, search.entry, diverged)}
    return table


def _interval(est: dict) -> str:
    if est["low"] is None:
        return f"{est['mean']:.2f}"
    return f"{est['mean']:.2f} ± {(est['high'] - est['low']) / 2:.2f}"


def _rounds(picked: list[int]) -> str:
    """The seeds' validation-picked rounds: one where they agree, else each seed's in seed order (a mean of
    rounds would name a round that was never evaluated)."""
    return str(picked[0]) if len(set(picked)) == 1 else ", ".join(map(str, picked))


def _shown(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _chosen(tuning: dict) -> str:
    if tuning["failed"]:
        return f"none: {tuning['failed']}"
    if "chosen" not in tuning:
        return f"searching ({tuning['trials_done']} of {tuning['trials']} trials done)"
    values = ", ".join(f"{k.removeprefix('algorithm.')} {_shown(v)}" for k, v in tuning["chosen"].items())
    return f"{values} (trial {tuning['trial']}; validation {tuning['validation']:.2f})"


def _pfllib(entry: Entry, stats: dict, setting: str, board: Board) -> str:
    """The row's last two cells: fedsim's best round on test (pooled) and PFLlib's, only where PFLlib's number is
    the same quantity; none on a board PFLlib has no numbers for (its page says so once)."""
    if board.pfllib is None:
        return ""
    if entry.pfllib is None:
        return " - | - |"
    if entry.pfllib_scores is not None:
        return f" - | {page(board)['left-out'].format(scores=entry.pfllib_scores)} |"
    ours = _interval(stats["pooled_best"]) if "pooled_best" in stats else "-"
    return f" {ours} | {board.pfllib.numbers[entry.pfllib][setting]} |"


def _per_round(stats: dict) -> str:
    """CPU seconds a round (wall seconds), or the wall seconds alone for seeds that ran before rounds recorded CPU."""
    wall = f"{stats['seconds']:.2f}"
    return wall + " wall" if stats["cpu_seconds"] is None else f"{stats['cpu_seconds']:.2f} ({wall})"


def _cost(stats: dict) -> str:
    """Training sample-steps per client and round, and the fine-tuning's per evaluation where the row fine-tunes."""
    tuned = f" + {stats['finetune_cost']:,.0f} fine-tuning / evaluation" if stats["finetune_cost"] else ""
    return f"{stats['cost']:,.0f}{tuned}"


def _mechanism_text(stats: dict) -> str:
    """The mechanism's value at the first finished seed, and its flag where a seed's mechanism is off."""
    found = stats.get("mechanism")
    if found is None:
        return "-"
    flag = "" if not found["flagged"] else f"; **{found['flag']}** ({found['flagged']} of {found['of']} seeds)"
    return found["value"].replace("|", "\\|") + flag  # Ditto's ||v - w|| would split the table's cell


def _row(entry: Entry, cell: dict, setting: str, board: Board) -> str:
    stats = cell["finals"]
    what = "fine-tuned" if entry.overrides.get("eval.finetune_epochs") else "own model"
    pfllib = _pfllib(entry, stats, setting, board)
    chosen = _chosen(cell["tuning"])
    failed = f" ({len(stats['diverged'])} diverged: {stats['diverged'][0]})" if stats["diverged"] else ""
    if "final" not in stats:
        left = "not run yet" if not stats["diverged"] else "diverged"
        return f"| `{entry.name}` | {what} | {chosen} | {left}{failed} | | | | | | | | 0 |" + (
            pfllib and " |" + pfllib.split("|", 1)[1])  # PFLlib's own number beside an empty cell of fedsim's
    on = "" if stats["picked_on"] == ["validation"] else " (picked on test: no validation split)"
    return (f"| `{entry.name}` | {what} | {chosen} | {_interval(stats['final'])} | {_interval(stats['picked'])}{on} "
            f"| {_rounds(stats['picked_rounds'])} | {stats['p10']:.2f} | {stats['jain']:.3f} | "
            f"{_mechanism_text(stats)} | {_cost(stats)} | "
            f"{_per_round(stats)} | {stats['seeds']} of {stats['planned']}{failed} |{pfllib}")


def _percent(fraction: float) -> str:
    return f"{100 * fraction:g}%"


def _smaller(full: Plan, text: dict[str, str]) -> str:
    """What in the protocol is smaller than PFLlib's (nothing to say on a board PFLlib has no numbers for)."""
    board, d = full.board, full.runs[0].config.data
    if board.pfllib is None:
        return ""
    cuts = [*([text["cut-rounds"].format(rounds=full.final_rounds, pfllib_rounds=board.pfllib.rounds)]
              if full.final_rounds < board.pfllib.rounds else []),
            *([text["cut-train"].format(percent=_percent(d.train_fraction))] if d.train_fraction < 1 else []),
            *([text["cut-test"].format(percent=_percent(d.test_fraction))] if d.test_fraction < 1 else [])]
    return text["smaller"].format(cuts=", ".join(cuts)) if cuts else text["as-pfllib"]


def cut(full: Plan, scale: str) -> str:
    """The board's protocol here, and what in it is smaller than PFLlib's, read from the runs' config."""
    cfg, board, text = full.runs[0].config, full.board, page(full.board)
    t, d = cfg.train, cfg.data
    return (text["protocol"].format(clients=d.num_clients, fraction=t.fraction, model=cfg.model.name,
                                    local_epochs=t.local_epochs, batch_size=t.batch_size, eval_every=t.eval_every,
                                    validation=_percent(d.validation), smaller=_smaller(full, text),
                                    sampled=round(t.fraction * d.num_clients), train=_percent(d.train_fraction),
                                    test=_percent(d.test_fraction), rounds=full.final_rounds,
                                    search_rounds=full.rounds, options=d.options)
            + (f"\n\n{board.sizing[scale]}" if scale in board.sizing else ""))


def _cpu_hours(cpu: list[float]) -> str:
    """The CPU time of the finished runs whose rounds measured it (none: said so, not as zero hours)."""
    if not cpu:
        return "; no finished run's rounds measured their CPU time once"
    return f", {sum(cpu) / 3600:.1f} CPU-core hours over the {len(cpu)} finished runs that recorded their CPU time"


def render(table: dict, scale: str, full: Plan, command: str, figure: str | None = None) -> str:
    """The page; ``figure``: the figure's path relative to the page, shown after how to read a row."""
    runs = full.runs
    finished = [p for p in runs if p.result() is not None]
    done = len(finished)
    waiting = full.tune.final_seeds * len(full.waiting())
    # rounds of this plan's runs, finished or not; a folder left by another plan's settings (changed) is not one
    seconds = sum(run_seconds(p.folder) for p in runs
                  if (p.folder / runfiles.ROUNDS).exists() and status(p.config) != "changed")
    cpu = [c for p in finished if (c := run_cpu_seconds(p.folder)) is not None]
    # A diverged run never finishes: say how many, so "N of M finished" accounts for every planned run.
    stopped = sum(cell["tuning"]["runs_diverged"] + len(cell["finals"]["diverged"])
                  for cells in table.values() for cell in cells.values())
    named = f"; {stopped} diverged, recorded and named below" if stopped else ""
    cfg, board, text = full.runs[0].config, full.board, page(full.board)
    scope = text["scope"].format(rounds=full.final_rounds, percent=_percent(cfg.data.train_fraction),
                                 pfllib_rounds=board.pfllib and board.pfllib.rounds)
    previous = [text["previous"], ""] if "previous" in text else []  # a page kept from an earlier protocol
    lines = [f"# {board.heading} ({scale} scale)", "", scope, "", *previous,
             f"Generated by `{command}` from {done} of {len(runs) + waiting} finished run folders "
             f"({len(full.search)} search runs, {len(full.finals) + waiting} final runs{named}; "
             f"{seconds / 3600:.1f} h of rounds measured on this machine{_cpu_hours(cpu)}). Do not edit by hand: run "
             "the command again.", "", cut(full, scale), "", text["tuning"].format(budget=full.budget(), selection=SELECTION), "",
             text["reading"], "", *([f"![Each row's accuracy over the rounds]({figure})", ""] if figure else []),
             f"{board.pfllib.protocol}." if board.pfllib else text["no-pfllib"], ""]
    for setting in board.settings:
        lines += [f"## {board.settings[setting].title}", "", text["header"],
                  "|" + "---|" * (text["header"].count("|") - 1)]
        lines += [_row(e, table[setting][e.name], setting, board) for e in board.entries if e.name in table[setting]]
        lines += ["", *ranking_lines(table[setting], full.final_rounds, text), *_spaces(table, setting), "",
                  *_receipts(setting, full.finals, board), ""]
    return "\n".join(lines)


def _spaces(table: dict, setting: str) -> list[str]:
    rows = [f"| `{method}` | {cell['tuning']['space']} | "
            f"{', '.join(map(str, cell['tuning']['failed_trials'])) or '-'} |"
            for method, cell in table[setting].items()]
    return ["Own spaces (searched in stage 2; none: stage 2 refines the step) and trials left out because they "
            "diverged:", "", "| method | own space | diverged trials |",
            "|---|---|---|", *rows]


def _receipts(setting: str, finals: list[PlannedRun], board: Board) -> list[str]:
    """Each method's receipt in one setting, from the configs its final seeds run (or ran) with."""
    arms = []
    for entry in board.entries:
        configs = [p.config for p in finals if p.key == run_key(setting, entry)]
        if configs:
            arms.append((f"`{entry.name}`", receipt([c.model_dump() for c in configs], [reported_key(configs[0])])))
    return ["Receipt (each method's final runs, from their configs):", "", *receipt_table(arms)] if arms else []


def write(table: dict, scale: str, full: Plan, command: str, report: Path) -> list[Path]:
    """The page, its numbers (.json) and its figure (images/ beside the page, where any row has a finished seed)."""
    report.parent.mkdir(parents=True, exist_ok=True)
    figure = report.parent / "images" / f"{report.stem}-{scale}.png"
    drawn = curves_figure(table, {s: full.board.settings[s].title for s in table}, figure)
    atomic.write_text(report, render(table, scale, full, command,
                                     f"images/{figure.name}" if drawn else None))
    results = report.with_suffix(".json")
    atomic.write_text(results, json.dumps({"scale": scale, "command": command, "budget": full.budget(),
                                           "table": table}, indent=1, default=str))
    return [report, results, *([figure] if drawn else [])]
