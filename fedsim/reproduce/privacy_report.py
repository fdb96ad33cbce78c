"""The privacy claim's report (``fedsim reproduce privacy``): a section of docs/privacy.md between its markers, a
table of accuracy by method and epsilon with each calibrated noise multiplier, the tests, and a figure of accuracy
against epsilon per method. Everything comes from the verdicts (``verdicts.evaluate``) and the finished runs'
summary.json (their ``privacy`` block), so the section is rebuilt from the kept runs alone.

The section lives in docs/privacy.md, not in REPRODUCTION.md: it is fedsim's own question, not a paper's claim, and
the page that says what the guarantee is should show what it costs. Its text around the table and the tests is
papers/privacy/page.md; the setting's prose stays there, this module fills in the numbers."""
from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from matplotlib.figure import Figure

from fedsim import atomic
from fedsim.config import RunConfig
from fedsim.core import runfiles
from fedsim.core.protocol import ACCURACIES
from fedsim.config.checks import trainable_clients
from fedsim.config.privacy import DEFAULT_DELTA_RULE, default_delta
from fedsim.reproduce.claims import Paper
from fedsim.reproduce.paper_files import file_passages
from fedsim.reproduce.privacy import (EPSILONS, FOLDER, LOCAL, METHODS, PROXY_RUN, RUN_METHODS, TESTED, arm_label,
                                      run_key)
from fedsim.metrics.logger import read_jsonl
from fedsim.reproduce.runner import read_summary, run_name

START, END = "<!-- privacy-claim:start -->", "<!-- privacy-claim:end -->"
HEADING = "## Does personalization keep what DP takes away?"
FIGURE = "privacy-cpu-accuracy-vs-epsilon.png"
PAGE = file_passages(FOLDER / "page.md")  # the section's own text around the table and the tests


def privacy_of_runs(paper: Paper, scale: str, runs_dir: Path, folders: dict[str, str],
                    seeds: int) -> dict[str, dict[str, list[float]]]:
    """Per epsilon (its name), what the finished runs' summary.json says of their privacy: the noise multiplier the
    accountant calibrated, the epsilon it accounted over the rounds run, and delta, each value once."""
    found: dict[str, dict[str, list[float]]] = {}
    for eps in EPSILONS:
        if eps is None:
            continue
        seen = found.setdefault(f"{eps:g}", {"noise_multiplier": [], "epsilon": [], "delta": []})
        for method in RUN_METHODS:
            for seed in range(seeds):
                summary = read_summary(runs_dir / run_name(paper, scale, folders[f"{method}-eps{eps:g}"], seed))
                for key, values in seen.items():
                    value = ((summary or {}).get("privacy") or {}).get(key)
                    if value is not None and not any(math.isclose(value, v, rel_tol=1e-9) for v in values):
                        values.append(float(value))
    return found


def round_privacy(folder: Path, key: str) -> list[float]:
    """A finished run's per-round value of ``key`` in rounds.jsonl's privacy record (empty where it has not
    finished or does not record it)."""
    if read_summary(folder) is None:
        return []
    return [float(row["privacy"][key]) for row in read_jsonl(folder / runfiles.ROUNDS) if key in row.get("privacy", {})]


def proxy_norms(paper: Paper, scale: str, runs_dir: Path, folders: dict[str, str], seeds: int) -> list[float]:
    """Per finished seed of the clip norm's proxy run, the median over its rounds of the round's mean update norm
    (before clipping): what the clip norm was chosen from."""
    per_seed = [round_privacy(runs_dir / run_name(paper, scale, folders[PROXY_RUN], seed), "update_norm_mean")
                for seed in range(seeds)]
    return [float(statistics.median(norms)) for norms in per_seed if norms]


def clipped_share(paper: Paper, scale: str, runs_dir: Path, folders: dict[str, str], seeds: int) -> float | None:
    """The mean over the rounds and seeds of FedAvg's most private runs of the share of clients whose update the
    clip norm shortened: how hard the proxy's clip norm binds on the evaluated clients."""
    shares = [share for seed in range(seeds) for share in round_privacy(
        runs_dir / run_name(paper, scale, folders[run_key("FedAvg", TESTED)], seed), "clipped_fraction")]
    return statistics.fmean(shares) if shares else None


def _cell(arm: dict | None) -> str:
    if not arm or not arm["seeds"]:
        return "-"
    est = arm["estimate"]
    interval = "" if est["low"] is None else f" [{est['low']:.1f}, {est['high']:.1f}]"
    return f"{est['mean']:.1f}{interval}"


def arms_by_label(results: dict) -> dict[str, dict]:
    """Each arm once (FedAvg's arms are read by every claim, identically)."""
    return {arm["label"]: arm for claim in results["claims"] for arm in claim["arms"]}


def accuracy_table(results: dict, privacy: dict[str, dict[str, list[float]]]) -> list[str]:
    """Methods by epsilon: client-mean accuracy (%) over seeds with its 95% interval; then z and the epsilon spent."""
    arms = arms_by_label(results)
    names = [f"ε = {'∞' if eps is None else f'{eps:g}'}" for eps in EPSILONS]
    lines = [f"| method (accuracy) | {' | '.join(names)} |", "|---|" + "---|" * len(EPSILONS)]
    local = _cell(arms.get(LOCAL))
    lines.append(f"| {LOCAL} (initial; shares nothing, no DP needed) | {' | '.join([local] * len(EPSILONS))} |")
    for method, (_, metric) in METHODS.items():
        cells = [_cell(arms.get(arm_label(method, eps))) for eps in EPSILONS]
        lines.append(f"| {method} ({ACCURACIES[metric]}) | {' | '.join(cells)} |")
    for key, what in (("noise_multiplier", "noise multiplier z (calibrated)"),
                      ("epsilon", "ε the accountant spent over the rounds")):
        cells = [", ".join(f"{v:.4g}" for v in privacy.get(f"{eps:g}", {}).get(key, [])) or "-"
                 if eps is not None else "no noise" for eps in EPSILONS]
        lines.append(f"| {what} | {' | '.join(cells)} |")
    return lines


def tests_table(results: dict) -> list[str]:
    lines = ["| claim | test (final round, points) | mean [95% CI] | seeds | what would have failed it | result |",
             "|---|---|---|---|---|---|"]
    for claim in results["claims"]:
        for test in claim["tests"]:
            est = test["estimate"]
            shown = "-" if est is None else (f"{est['mean']:+.2f}" + (
                "" if est["low"] is None else f" [{est['low']:.2f}, {est['high']:.2f}]"))
            title = claim["title"] + ("" if claim.get("counts", True) else " (a check of the setting, outside the "
                                                                             "tally)")
            lines.append(f"| {title} | {test['text']} | {shown} | {len(test['seeds'])} of "
                         f"{claim['seeds']} | {test['fails_if']} | **{test['verdict']}** |")
    return lines


def accuracy_figure(results: dict, path: Path) -> None:
    """Accuracy against epsilon per method: the mean over seeds with its 95% interval; epsilon on a log axis, with
    no privacy (inf) drawn one step past the largest epsilon."""
    arms = arms_by_label(results)
    finite = [eps for eps in EPSILONS if eps is not None]
    x_of = {eps: float(eps) if eps is not None else 2.0 * max(finite) for eps in EPSILONS}
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, method in enumerate(METHODS):
        points = [(x_of[eps], arms[arm_label(method, eps)]["estimate"]) for eps in EPSILONS
                  if arm_label(method, eps) in arms and arms[arm_label(method, eps)]["seeds"]]
        if not points:
            continue
        xs, means = [x for x, _ in points], [e["mean"] for _, e in points]
        low = [m - (e["low"] if e["low"] is not None else m) for m, (_, e) in zip(means, points)]
        high = [(e["high"] if e["high"] is not None else m) - m for m, (_, e) in zip(means, points)]
        ax.errorbar(xs, means, yerr=[low, high], marker="o", capsize=4, color=f"C{i}",
                    label=f"{method} ({ACCURACIES[METHODS[method][1]]})")
    ax.set_xscale("log", base=2)
    ax.set_xticks([x_of[eps] for eps in EPSILONS],
                  [f"{eps:g}" if eps is not None else "∞ (no DP)" for eps in EPSILONS])
    ax.set(xlabel="ε (user-level, central DP)", ylabel="client accuracy, mean over clients (%)", ylim=(0, 100),
           title="Accuracy against ε (mean over seeds, 95% interval)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    fig.savefig(path, dpi=100)


def setting(config: RunConfig) -> str:
    """The setting in words, from the runs' own config (the ε = 1 FedAvg run of seed 0, as planned)."""
    d, t, p = config.data, config.train, config.privacy
    assert p is not None
    trainable = trainable_clients(config)
    delta = p.delta if p.delta is not None else default_delta(trainable)
    k = getattr(d.partition, "k", None)  # the classes partition's classes per client
    return PAGE["page-setting"].format(
        dataset=d.dataset, clients=d.num_clients, partition=d.partition.name, classes=f", k = {k}" if k else "",
        model=config.model.name, rounds=t.rounds, local_epochs=t.local_epochs, batch_size=t.batch_size,
        sampling=t.sampling, fraction=t.fraction, per_round=t.fraction * d.num_clients, weighting=t.weighting,
        clip_norm=p.clip_norm, delta=delta, delta_rule=DEFAULT_DELTA_RULE if p.delta is None else "set",
        n_delta=trainable * delta, accountant=p.accountant)


def clip_norm_note(config: RunConfig, norms: list[float], clipped: float | None) -> str:
    """Where the clip norm came from: the proxy run's update norms (not the evaluated clients' data), as measured,
    and how often it clipped the evaluated clients' updates."""
    assert config.privacy is not None
    measured = (", ".join(f"{n:.3f}" for n in norms) + f" (seed{'s' if len(norms) > 1 else ''} 0"
                + (f"..{len(norms) - 1}" if len(norms) > 1 else "") + ")") if norms else "not run yet"
    binds = "" if clipped is None else PAGE["page-binds"].format(percent=100 * clipped, tested=TESTED)
    return PAGE["page-clip-norm"].format(clip_norm=config.privacy.clip_norm, measured=measured, binds=binds)


def section(results: dict, privacy: dict[str, dict[str, list[float]]], config: RunConfig, figure_rel: str,
            norms: list[float], clipped: float | None = None) -> str:
    done, total = results["runs_done"], results["runs_total"]
    seconds = results["compute_seconds"]
    per_run = f"; {seconds / done:.0f} s a run on average" if done else ""
    lines = [START, "", PAGE["page-written"].format(command=results["command"]), "",
             f"**Setting:** {setting(config)}. {results['scale_note']}.", "",
             f"{clip_norm_note(config, norms, clipped)}.", "",
             PAGE["page-compute"].format(done=done, total=total, minutes=seconds / 60, per_run=per_run), "",
             PAGE["page-accuracy"], "",
             *accuracy_table(results, privacy), "",
             *tests_table(results), "",
             PAGE["page-tests"], ""]
    explained = [c for c in results["claims"] if c["verdict"] != "reproduced" and c.get("explanation")]
    lines += [f"*{c['title']}:* {c['explanation']}" for c in explained] + ([""] if explained else [])
    if figure_rel:
        lines += [f"![accuracy against epsilon per method]({figure_rel})", ""]
    return "\n".join(lines + [END])


def write_section(page: Path, text: str) -> None:
    """Put ``text`` (markers included) between the page's markers, or append it under its heading where the page
    has none (or does not exist yet)."""
    old = page.read_text() if page.exists() else "# Privacy\n"
    if START in old and END in old:
        new = old[:old.index(START)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + f"\n\n{HEADING}\n\n{text}\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(page, new)


def write(results: dict, privacy: dict[str, dict[str, list[float]]], config: RunConfig, page: Path,
          figures: Path, norms: list[float], clipped: float | None = None) -> list[Path]:
    """The figure (where any arm has finished) and the page's section; returns what was written."""
    figures.mkdir(parents=True, exist_ok=True)
    figure = figures / FIGURE
    written = []
    if any(arm["seeds"] for arm in arms_by_label(results).values()):
        accuracy_figure(results, figure)
        written.append(figure)
    else:  # a figure drawn from runs that are gone would outlive its numbers
        figure.unlink(missing_ok=True)
    rel = _relative(figure, page.parent) if figure.exists() else ""
    write_section(page, section(results, privacy, config, rel, norms, clipped))
    return [*written, page]


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()
