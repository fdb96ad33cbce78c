"""The leaderboard's ranking of one setting, from its table's cells: which rows are ranked (every planned final seed
finished, none diverged), their groups (the rows Holm's step-down test does not separate from each group's first),
the order's stability over the last quarter of the rounds and the ranking at equal compute, then the same as the
page's lines. The statistics themselves are ``leaderboard_stats``'; this module chooses nothing."""
from __future__ import annotations

from typing import Any

from fedsim.reproduce import leaderboard_stats as more


def finished(cells: dict[str, dict]) -> dict[str, dict]:
    """The rows whose planned final seeds have all finished (none diverged): what is ranked."""
    return {m: f for m, c in cells.items()
            if "final" in (f := c["finals"]) and f["seeds"] == f["planned"] and not f["diverged"]}


def ranking(cells: dict[str, dict], rounds: int) -> dict[str, Any]:
    """The finished rows: their groups (not separated, Holm), the order's stability over the rounds and the ranking
    at equal compute."""
    done = finished(cells)
    if not done:
        return {}
    curves = {m: f["curve"] for m, f in done.items()}
    evaluated = sorted(set.intersection(*(set(c) for c in curves.values())))
    return {"final": {m: f["final"]["mean"] for m, f in done.items()},
            **more.groups({m: {int(s): v for s, v in f["by_seed"].items()} for m, f in done.items()}),
            "stability": more.stability(curves, more.marks(rounds, evaluated)),
            "equal_compute": more.equal_compute(curves, {m: f["cost"] for m, f in done.items()}, rounds)}


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _why_unranked(cell: dict) -> str:
    if cell["tuning"]["failed"]:
        return "not ranked, its search chose no settings"
    if cell["finals"]["diverged"]:
        return "not ranked, a final seed diverged"
    return "still running (not ranked until every final seed has finished)"


def _versus(ranked: dict[str, Any], method: str) -> str:
    found = ranked["versus"].get(method)
    if found is None:
        return "- | - | -"
    d = found["difference"]
    interval = "" if d["low"] is None else f" [{d['low']:+.2f}, {d['high']:+.2f}]"
    return f"`{found['first']}` | {d['mean']:+.2f}{interval} | {found['p_holm']:.3f}"


def ranking_lines(cells: dict[str, dict], rounds: int, text: dict[str, str]) -> list[str]:
    """The ranking's part of the page for one setting: its opening sentence (``text["ranking"]``, the board's words),
    the order's stability and the table of groups; nothing where no row has finished."""
    ranked = ranking(cells, rounds)
    if not ranked:
        return []
    unranked: dict[str, list[str]] = {}
    for method, cell in cells.items():
        if method not in ranked["final"]:
            unranked.setdefault(_why_unranked(cell), []).append(f"`{method}`")
    left = [f"{why}: {', '.join(methods)}" for why, methods in unranked.items()]
    stable = ranked["stability"]
    ranks, marks, gain = stable["ranks"], stable["marks"], stable["gain"]
    by_compute = ranked["equal_compute"]
    rows = []
    for letter, group in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", ranked["groups"]):
        for method in group:
            at_marks = " / ".join(str(ranks[label].get(method, "-")) for label in marks)
            compute = by_compute["ranks"].get(method)
            at = by_compute["round"][method]
            rows.append(f"| {letter} | `{method}` | {ranked['final'][method]:.2f} | {_versus(ranked, method)} | "
                        f"{at_marks} | {gain.get(method, float('nan')):+.2f} | "
                        + ("- (its first evaluated round costs more) |" if compute is None
                           else f"{compute} (round {at}, {by_compute['level'][method]:.2f}) |"))
    return [text["ranking"].format(marks=", ".join(f"{label} = round {r}" for label, r in marks.items()))
            + (" " + _sentence("; ".join(left)) if left else " Every row is ranked."), "",
            _stability_sentence(stable), "",
            "| group | method | final round % | its group's first | the first minus it (points, Bonferroni 95% "
            "joint CI) | Holm p | rank at " + " / ".join(marks) + " | last-quarter gain (points) | rank at equal "
            "compute |", "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def _stability_sentence(stable: dict[str, Any]) -> str:
    """Whether the order still moves over the last quarter of the rounds, and which pairs do."""
    if stable["tau"] is None:
        return "The order's stability needs every ranked row evaluated at 3R/4 and R."
    tau, marks = stable["tau"], stable["marks"]
    verdict = ("stable" if tau >= more.STABLE_TAU else "still moving")
    pairs = ", ".join(f"`{a}` / `{b}`" for a, b in stable["moving"]) or "none"
    return (f"**The order at this budget is {verdict}**: Kendall's tau between the orders at round {marks['3R/4']} "
            f"and round {marks['R']} is {tau:.2f} (stable from {more.STABLE_TAU}); pairs whose order flips over the "
            f"last quarter: {pairs}.")
