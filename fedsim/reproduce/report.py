"""The verdicts written out: each paper and scale's results as ``<figures>/<paper>-<scale>.json`` with one
figure per claim, and REPRODUCTION.md rendered from all of them, so reproducing one paper never drops the other's
section. The verdicts themselves are computed in ``verdicts``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedsim import atomic
from fedsim.core import runfiles
from fedsim.core.protocol import ACCURACIES
from fedsim.metrics.receipt import receipt_table
from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import MARGIN
from fedsim.reproduce.paper_files import PAPERS_DIR, file_passages
from fedsim.reproduce.verdicts import DEPENDS, INCONCLUSIVE, NO_EFFECT, NOT_REPRODUCED, REPRODUCED, seeds_missing

HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"
PAGE_TEXT = PAPERS_DIR / "reproduction.md"  # the page's own text around the papers' sections


def page_text(path: Path = PAGE_TEXT) -> dict[str, str]:
    """The page's title, intro, rule of verdicts and paper-scale note, the rule's margin and split verdict filled in."""
    text = file_passages(path)
    return {**text, "rule": text["rule"].format(margin=MARGIN, depends=DEPENDS)}


def claim_figure(claim: dict, path: Path) -> None:
    """Bars: mean over seeds with the 95% interval; dots: each seed's mean over clients."""
    arms = [a for a in claim["arms"] if a["seeds"] and a.get("unit") != "rounds"]  # accuracies: rounds are no bar
    fig = Figure(figsize=(max(5.5, 1.3 * len(arms) + 2), 4.4), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(arms))
    means = [a["estimate"]["mean"] for a in arms]
    errors = [[m - (a["estimate"]["low"] if a["estimate"]["low"] is not None else m) for m, a in zip(means, arms)],
              [(a["estimate"]["high"] if a["estimate"]["high"] is not None else m) - m for m, a in zip(means, arms)]]
    ax.bar(x, means, yerr=errors, capsize=5, color="C0", alpha=0.6, label="mean over seeds, 95% CI")
    for i, arm in enumerate(arms):
        ax.scatter(np.full(len(arm["per_seed_mean"]), i), arm["per_seed_mean"], color="black", s=14, zorder=3,
                   label="one seed's client mean" if i == 0 else None)
    ax.set_xticks(x, [a["label"] for a in arms], rotation=20 if len(arms) > 3 else 0, fontsize="small")
    metrics = sorted({ACCURACIES[a["metric"]] for a in arms})
    ax.set(ylabel=f"{' / '.join(metrics)} client accuracy (%)", ylim=(0, 100), title=claim["title"])
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")
    fig.savefig(path, dpi=100)


def write_results(results: dict, figures: Path) -> Path:
    """The paper's JSON and its figures under ``figures`` (a claim with no finished run has none: an older figure of
    it is removed); returns the JSON's path."""
    figures.mkdir(parents=True, exist_ok=True)
    for claim in results["claims"]:
        name = f"{results['paper']}-{results['scale']}-{claim['id']}.png"
        if any(a["seeds"] for a in claim["arms"]):
            claim_figure(claim, figures / name)
            claim["figure"] = name
        else:  # a figure drawn from runs that are gone (other settings, another machine) would outlive its numbers
            (figures / name).unlink(missing_ok=True)
    path = figures / f"{results['paper']}-{results['scale']}.json"
    atomic.write_text(path, json.dumps(results, indent=1))
    return path


def _interval(est: dict | None, signed: bool = False) -> str:
    if est is None:
        return "-"
    mean = f"{est['mean']:+.2f}" if signed else f"{est['mean']:.2f}"
    return mean if est["low"] is None else f"{mean} [{est['low']:.2f}, {est['high']:.2f}]"


def _seeds_fixed(claim: dict) -> int | None:
    """The seeds the claim fixes (None in results written before claims fixed them)."""
    return claim.get("seeds")


def _seeds_done(claim: dict) -> str:
    """"x of n": the seeds every test of the claim has finished, of those it fixes."""
    done = min((len(t["seeds"]) for t in _counted_tests(claim)), default=0)
    fixed = _seeds_fixed(claim)
    return f"{done} of {fixed}" if fixed is not None else str(done)


def _shown_verdict(claim: dict) -> str:
    if not claim.get("counts", True):
        return f"outside the tally ({claim.get('outside') or 'smoke check'}): {claim['verdict']}"
    return f"**{claim['verdict']}**"


def _counted_tests(claim: dict) -> list[dict]:
    return [t for t in claim["tests"] if t.get("counts", True)]


def _first_tests(claim: dict) -> str:
    """The first counted test's interval at each counted setting (one without settings: its first test)."""
    shown: dict[str | None, dict] = {}
    for test in _counted_tests(claim):
        shown.setdefault(test.get("setting"), test)
    many = len(shown) > 1
    return "; ".join(_interval(t["estimate"], signed=True) + (f" ({t['setting']})" if many else "")
                     for t in shown.values())


def headline_rows(results: list[dict]) -> list[str]:
    lines = ["| paper | scale | claim | paper's or peer's number | first test | fedsim: mean [95% CI] | seeds "
             "finished | verdict |", "|---|---|---|---|---|---|---|---|"]
    for res in results:
        for claim in res["claims"]:
            first = _counted_tests(claim)[0]
            text = first["text"].removesuffix(f" [{first['setting']}]") if first.get("setting") else first["text"]
            lines.append(f"| {res['paper']} | {res['scale']} | {claim['title']} | {claim['paper_number']} | "
                         f"{text} | {_first_tests(claim)} | {_seeds_done(claim)} | {_shown_verdict(claim)} |")
    return lines


VERDICTS = (REPRODUCED, NOT_REPRODUCED, NO_EFFECT, DEPENDS, INCONCLUSIVE)


def tally(results: list[dict]) -> str:
    """The counted claims by verdict; the claims outside the tally (counts=False) named apart, with their reason."""
    counted = [c for r in results for c in r["claims"] if c.get("counts", True)]
    outside = [c for r in results for c in r["claims"] if not c.get("counts", True)]
    by = {v: sum(1 for c in counted if c["verdict"] == v) for v in VERDICTS}
    line = f"Of {len(counted)} claims: " + ", ".join(f"{by[v]} {v}" for v in VERDICTS)
    if not outside:
        return line + "."
    return line + "; outside the tally: " + "; ".join(
        f"`{c['id']}` ({c.get('outside') or 'smoke check'})" for c in outside) + "."


def _cpu_hours(results: list[dict]) -> str:
    """The CPU time of the finished runs that recorded it (rounds.jsonl ``cpu_seconds``; older runs did not), which
    the load of runs beside them does not raise as it raises their wall time."""
    runs = sum(r.get("compute_cpu_runs", 0) for r in results)
    if not runs:
        return ""
    hours = sum(r.get("compute_cpu_seconds", 0.0) for r in results) / 3600
    return f"; {hours:.1f} CPU-core hours over the {runs} of them that recorded their CPU time"


def _progress(results: list[dict]) -> str:
    def cap(r: dict) -> str:
        new = any("seeds" in c for c in r["claims"])  # results written before claims fixed their seeds: no cap
        return f" (capped at {r['seeds']} seeds by --seeds)" if r.get("seeds") and new else ""

    done = "; ".join(f"{r['paper']} ({r['scale']}) {r['runs_done']} of {r['runs_total']} runs{cap(r)}"
                     for r in results)
    hours = sum(r["compute_seconds"] for r in results) / 3600
    left = sum(r["runs_total"] - r["runs_done"] for r in results)
    remaining = (f"{left} run{'' if left == 1 else 's'} left (`--dry-run` estimates their time)" if left
                 else "no run left")
    return (f"Runs finished: {done}. Total compute: {hours:.1f} h of rounds over the finished runs (summed over runs "
            f"that shared a 2-core machine){_cpu_hours(results)}; {remaining}. Each claim fixes its seeds before it "
            "runs; it is decided only once all of them have finished.")


def _claim_section(claim: dict, scale: str, figures_rel: str) -> list[str]:
    fixed = _seeds_fixed(claim)
    lines = [f"### {claim['title']} (`--only {claim['id']}`)", "", f"**Paper:** {claim['paper_says']}", "",
             f"**Here ({scale}):** {claim['regime']}", ""]
    if claim.get("paper_number", "-") != "-":
        lines += [f"**Paper's or peer's number** (beside fedsim's below): {claim['paper_number']}", ""]
    if claim.get("peer_gap"):
        lines += [f"**Why fedsim's level differs from the peer's:** {claim['peer_gap']}", ""]
    if not claim.get("counts", True):
        lines += [f"**Outside the tally** ({claim.get('outside') or 'a smoke check'}): shown here, outside the verdict "
                  "count and the headline's tally.", ""]
    lines += [f"Seeds: {_seeds_done(claim)} finished" + (f" (the claim fixes seeds 0..{fixed - 1})." if fixed else "."),
              "", "| arm | accuracy | final round: mean % [95% CI] | best round: mean % [95% CI] | seeds | client std | "
              "client min | client p10 |", "|---|---|---|---|---|---|---|---|"]
    for arm in claim["arms"]:
        if arm.get("unit") == "rounds":  # a speed: one value per seed, no clients to spread
            lines.append(f"| {arm['label']} | {ACCURACIES[arm['metric']]}: rounds to {arm['to_fraction']:.0%} of "
                         f"its own final | {_interval(arm.get('estimate'))} rounds | - | {len(arm['seeds'])} | "
                         "- | - | - |")
            continue
        spread = [f"{arm[f'client_{k}']:.2f}" if arm["seeds"] else "-" for k in ("std", "min", "p10")]
        lines.append(f"| {arm['label']} | {ACCURACIES[arm['metric']]} | {_interval(arm.get('estimate'))} | "
                     f"{_best_cell(arm)} | {len(arm['seeds'])} | {' | '.join(spread)} |")
    receipts = [(arm["label"], arm["receipt"]) for arm in claim["arms"] if "receipt" in arm]
    if receipts:
        differ = ", ".join(claim.get("differences", [])) or "nothing but their seeds"
        lines += ["", "Receipt (from each arm's stored config):", "", *receipt_table(receipts), "",
                  f"The arms differ in: {differ}."]
    lines += ["", "| test (final round) | mean [95% CI] | seeds | what would have failed it | result |",
              "|---|---|---|---|---|"]
    for test in claim["tests"]:
        context = "" if test.get("counts", True) else " (untested context)"
        lines.append(f"| {test['text']} | {_interval(test['estimate'], signed=True)} | {len(test['seeds'])} | "
                     f"{test.get('fails_if', '-')} | {test_outcome(test)}{context} |")
    fails = list(dict.fromkeys(t["fails_if"] for t in _counted_tests(claim) if t.get("fails_if")))
    if fails:
        lines += ["", f"**What would have failed it:** any test failing: {'; '.join(fails)}."]
    for setting in claim.get("settings", []):
        done = min(len(t["seeds"]) for t in claim["tests"] if t.get("setting") == setting["label"])
        context = "" if setting["counts"] else ", untested context, not counted"
        lines += ["", f"At {setting['label']}: {setting['verdict']} ({done} of {_seeds_fixed(claim)} seeds "
                      f"finished{context})."]
    outside = "" if claim.get("counts", True) else " (outside the tally)"
    lines += ["", f"**Verdict: {claim['verdict']}{outside}.**", ""]
    if claim["explanation"] and _needs_explaining(claim):
        lines += [f"*Why:* {claim['explanation']}", ""]
    if "figure" in claim:
        lines += [f"![{claim['id']}]({figures_rel}/{claim['figure']})", ""]
    return lines


def _best_cell(arm: dict) -> str:
    if arm.get("round") is not None and arm["seeds"]:
        return "- (a point of the curve)"
    if arm.get("best_is_final"):
        return "= final (evaluated once)"
    on_test = "" if arm.get("best_on") == "validation" else " (on test)"
    return _interval(arm.get("estimate_best")) + on_test


def _needs_explaining(claim: dict) -> bool:
    """Failed, or undecided although every test has the seeds to decide (not merely runs still missing)."""
    undecided = claim["verdict"] == INCONCLUSIVE and not any(seeds_missing(t) for t in _counted_tests(claim))
    return claim["verdict"] in (NOT_REPRODUCED, NO_EFFECT, DEPENDS) or undecided


def test_outcome(test: dict) -> str:
    """A test's result in words: an equivalence outcome says what it is, with its interval."""
    if test["verdict"] != NO_EFFECT or test["estimate"] is None:
        return test["verdict"]
    unit = f" {test['unit']}" if test.get("unit") else " points"
    return (f"no effect ≥ {test['margin_total']:g}{unit}: interval [{test['estimate']['low']:.2f}, "
            f"{test['estimate']['high']:.2f}]")


def _paper_section(res: dict, figures_rel: str) -> list[str]:
    hours = res["compute_seconds"] / 3600
    lines = [f"## {res['title']} - scale `{res['scale']}`", "",
             f"Regenerate: `{res['command']}` (the run folders are not committed: each finished run's results are "
             "kept in `reproduction/runs/` (or the command's --kept), committed, and put back on another "
             f"machine; finished runs are skipped, interrupted ones resume). Runs finished: {res['runs_done']} of {res['runs_total']}; their rounds "
             f"took {hours:.2f} h in total (training, aggregation and evaluation summed over the runs and their "
             "resumes, Ray's start-up excluded; on a 2-core CPU machine, where runs that shared it side by side "
             f"each count in full, so the sum exceeds the elapsed time){_cpu_hours([res])}.", "",
             f"What this scale cuts: {res['scale_note']}", ""]
    for claim in res["claims"]:
        lines += _claim_section(claim, res["scale"], figures_rel)
    return lines


def render(figures: Path, report: Path) -> str:
    """REPRODUCTION.md from every ``<paper>-<scale>.json`` in ``figures``."""
    order = {key: i for i, key in enumerate(PAPERS)}  # the papers in the order they appeared
    results = sorted((json.loads(p.read_text()) for p in figures.glob("*.json")),
                     key=lambda r: (order.get(r["paper"], len(order)), r["paper"], r["scale"]))
    rel = (figures.relative_to(report.parent) if figures.is_relative_to(report.parent) else figures).as_posix()
    text = page_text()
    lines = [f"# {text['title']}", "", text["intro"], "", text["rule"], "", "## Headline", "", HEADLINE_START,
             _progress(results), "", tally(results), "", *headline_rows(results), HEADLINE_END, ""]
    for res in results:
        lines += _paper_section(res, rel)
    return "\n".join([*lines, "## Paper scale", "", text["paper-scale"], ""])


def write_report(figures: Path, report: Path) -> list[Path]:
    """REPRODUCTION.md, and the headline block of a README.md beside it that shows one (between the markers)."""
    markdown = render(figures, report)
    atomic.write_text(report, markdown)
    readme = report.parent / "README.md"
    if readme.exists() and HEADLINE_START in (text := readme.read_text()):
        atomic.write_text(readme, text.replace(headline_block(text), headline_block(markdown)))
        return [report, readme]
    return [report]


def headline_block(markdown: str) -> str:
    """The headline table between its markers (the README shows the same block)."""
    start, end = markdown.index(HEADLINE_START), markdown.index(HEADLINE_END)
    return markdown[start:end + len(HEADLINE_END)]
