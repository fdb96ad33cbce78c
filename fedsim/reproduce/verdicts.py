"""Claim verdicts computed from run folders: each arm's per-seed statistics, each test's paired contrast with its
95% interval and verdict, each claim's verdict, and everything one paper at one scale says.

Every number comes from the runs' summary.json: the final round's per-client accuracies (what the tests use) and
the best round's client mean (shown beside it, as PFLlib and the FedBABU authors report)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.core import runfiles
from fedsim.core.protocol import ACCURACIES
from fedsim.metrics.confidence import Estimate, mean_ci
from fedsim.metrics.logger import read_jsonl
from fedsim.metrics.receipt import differences, receipt, stored_config
from fedsim.metrics.summary import summarize
from fedsim.reproduce.claims import Arm, Claim, Paper, Setting, Test
from fedsim.reproduce.runner import (client_values_at, client_means, read_summary, run_cpu_seconds, run_name,
                                     run_seconds)

HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
# A test whose interval lies below threshold + margin but not wholly below the threshold: no effect as large as the
# margin, which neither confirms nor refutes the direction; a claim with such a test (and none failing) is worded so.
NO_EFFECT = "no effect ≥ margin"
REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
# The counted settings of a claim (Paper.settings: the optimizer) decide it differently: never counted as reproduced.
DEPENDS = "depends on the optimizer at this scale"


def client_values(folder: Path, metric: str) -> list[float] | None:
    """The final round's per-client accuracies (0..1) of a finished run, or None when it has not finished."""
    summary = read_summary(folder)
    if summary is None:
        return None
    key = f"per_client_{metric}"
    if key not in summary:
        raise ValueError(f"{folder}: summary.json has no {key} (the run did not measure {ACCURACIES[metric]} "
                         "accuracy); run it again with `fedsim reproduce`")
    return [float(v) for v in summary[key].values()]


def best_value(folder: Path, metric: str) -> float | None:
    """The best evaluation round's client-mean accuracy (0..1) of a finished run (summary.json's best_round), or
    None where the run has not finished or predates best_round."""
    summary = read_summary(folder)
    best = (summary or {}).get("best_round", {}).get(metric)
    return None if best is None else float(best["mean"])


def best_picked_on(folder: Path, metric: str) -> str:
    """What a finished run's best round was picked on: ``validation`` (data.validation), or ``test`` (the best on
    test, as PFLlib reports it; a summary from before validation existed is one)."""
    summary = read_summary(folder)
    return (summary or {}).get("best_round", {}).get(metric, {}).get("picked_on", "test")


def evaluations(folder: Path, metric: str) -> int:
    """How many rounds of a finished run evaluated ``metric`` (its rounds.jsonl rows that carry it): with one, the
    best round is the final round by construction, not by measurement."""
    return sum(metric in row for row in read_jsonl(folder / runfiles.ROUNDS))


def _arm_result(arm: Arm, per_seed: dict[int, list[float]], best: dict[int, float | None] | None = None,
                evaluated: dict[int, int] | None = None, picked_on: dict[int, str] | None = None) -> dict[str, Any]:
    """Mean client accuracy per seed (final round) and its CI; the per-client spread averaged over seeds; the best
    round's client mean per seed and its CI where every finished seed has one and some seed evaluated more than one
    round (``evaluated``: the seed's evaluation count; with one everywhere, ``best_is_final`` says so instead);
    all in points."""
    if arm.to_fraction is not None:  # one value per seed, in rounds: no clients to summarize
        rounds = [per_seed[s][0] for s in sorted(per_seed)]
        return {"label": arm.label, "run": arm.run, "metric": arm.metric, "round": None, "unit": "rounds",
                "to_fraction": arm.to_fraction, "seeds": sorted(per_seed), "per_seed_mean": rounds,
                "per_seed_std": [0.0] * len(rounds), **({"estimate": asdict(mean_ci(rounds))} if rounds else {})}
    stats = {seed: summarize(values) for seed, values in per_seed.items()}
    means = [100 * stats[s]["mean"] for s in sorted(stats)]
    result: dict[str, Any] = {"label": arm.label, "run": arm.run, "metric": arm.metric, "round": arm.round,
                              "seeds": sorted(stats), "per_seed_mean": means,
                              "per_seed_std": [100 * stats[s]["std"] for s in sorted(stats)]}
    if stats:
        result["estimate"] = asdict(mean_ci(means))
        for key in ("std", "min", "p10"):
            result[f"client_{key}"] = float(np.mean([100 * stats[s][key] for s in stats]))
        measured = {seed: value for seed, value in (best or {}).items() if value is not None}
        evaluated = evaluated or {}
        if evaluated and all(evaluated.get(s) == 1 for s in stats):
            result["best_is_final"] = True
        elif all(s in measured for s in stats):
            result["per_seed_best"] = [100 * measured[s] for s in sorted(stats)]
            result["estimate_best"] = asdict(mean_ci(result["per_seed_best"]))
            on = {(picked_on or {}).get(s, "test") for s in stats}
            result["best_on"] = "validation" if on == {"validation"} else "test"
    return result


def _test_result(test: Test, arms: dict[str, dict[str, Any]], seeds: int = 2) -> dict[str, Any]:
    """The test's contrast over the seeds where every arm it names has finished; decided only once ``seeds``
    (the claim's own, at least 2) have: holds when the interval's low clears the threshold, fails when its high is
    below the threshold (the opposite direction), no effect ≥ margin when its high is below threshold + margin
    otherwise, inconclusive otherwise."""
    column = "per_seed_std" if test.stat == "std" else "per_seed_mean"
    finished = sorted(set.intersection(*(set(arms[label]["seeds"]) for label, _ in test.terms)))
    values = [sum(coef * arms[label][column][arms[label]["seeds"].index(s)] for label, coef in test.terms)
              for s in finished]
    result: dict[str, Any] = {"text": test.text, "above": test.above, "margin": test.margin,
                              "fails_if": test.fails_if(), "seeds": finished, "seeds_fixed": seeds, "values": values,
                              "estimate": None, "verdict": INCONCLUSIVE, "unit": test.unit,
                              "margin_total": test.margin * test.steps if test.steps else test.margin}
    if values:
        est = mean_ci(values)
        result["estimate"] = _as_written(test, est)
        if len(values) >= max(2, seeds):
            assert est.low is not None and est.high is not None  # two or more values: mean_ci gives an interval
            result["verdict"] = (HOLDS if est.low > test.above else FAILS if est.high < test.above
                                 else NO_EFFECT if est.high < test.above + test.margin else INCONCLUSIVE)
    return result


def _as_written(test: Test, est: Estimate) -> dict[str, Any]:
    """The estimate in the test's own terms: an upper bound ("FedAvg < 20") is computed as -FedAvg > -20
    but shown as FedAvg's value."""
    if not test.upper_bound:
        return asdict(est)
    flip = {"low": -est.high if est.high is not None else None, "high": -est.low if est.low is not None else None}
    return {**asdict(est), "mean": -est.mean, **flip}


def claim_verdict(tests: list[dict], pending: bool = False) -> str:
    """A failed test decides the claim whatever is left to run; no effect waits for every seed (``pending``: runs
    missing), since a test still running may yet fail."""
    verdicts = {t["verdict"] for t in tests}
    return (REPRODUCED if verdicts == {HOLDS} else NOT_REPRODUCED if FAILS in verdicts
            else NO_EFFECT if NO_EFFECT in verdicts and not pending else INCONCLUSIVE)


# From the worst: what a claim's settings that disagree, none of them reproducing it, are worded as.
WORST_FIRST = (NOT_REPRODUCED, NO_EFFECT, INCONCLUSIVE)


def combined_verdict(verdicts: list[str], pending: bool) -> str:
    """The claim's verdict over its counted settings: theirs where they agree; inconclusive while a run is missing;
    ``DEPENDS`` (never counted as reproduced) only where one setting reproduces it; otherwise the worst of theirs,
    so "depends on the optimizer" never hides a claim no setting reproduces."""
    if len(set(verdicts)) == 1:
        return verdicts[0]
    if pending:
        return INCONCLUSIVE
    if REPRODUCED in verdicts:
        return DEPENDS
    return next(v for v in WORST_FIRST if v in verdicts)


def rounds_to(curve: dict[int, float], fraction: float) -> int:
    """The first evaluation round whose client mean reaches ``fraction`` of the curve's final (last round's) client
    mean: how fast a run converges to its own level, apart from that level."""
    final = curve[max(curve)]
    return next(r for r in sorted(curve) if curve[r] >= fraction * final)


def _seed_values(arm: Arm, folder: Path) -> list[float] | None:
    """What an arm reads of one seed's run: the final round's per-client accuracies, a round's (``arm.round``), or
    one value, the rounds to a fraction of its own final accuracy (``arm.to_fraction``); None before it finished."""
    if arm.to_fraction is not None:
        curve = client_means(folder, arm.metric)
        return None if curve is None else [float(rounds_to(curve, arm.to_fraction))]
    if arm.round is not None:
        return client_values_at(folder, arm.metric, arm.round)
    return client_values(folder, arm.metric)


def _evaluate_at(claim: Claim, paper: Paper, scale: str, runs_dir: Path, folders: dict[str, str],
                 setting: Setting) -> tuple[dict[str, dict], list[dict], list[str]]:
    """The claim's arms, tests and the arms' differing settings at one setting (its runs: key + suffix)."""
    arms = {}
    configs: dict[str, list[dict]] = {}  # per arm, its finished seeds' stored configs: its receipt's source
    for arm in claim.arms:
        per_seed, best, evaluated, picked_on, configs[arm.label] = {}, {}, {}, {}, []
        set_up: list[str] | None = None  # the optimizers its first finished seed set up (summary.json's, if recorded)
        for seed in range(claim.seeds):
            folder = runs_dir / run_name(paper, scale, folders[arm.run + setting.suffix], seed)
            values = _seed_values(arm, folder)
            if values is None:
                continue
            per_seed[seed] = values
            configs[arm.label].append(stored_config(folder))
            set_up = set_up or (read_summary(folder) or {}).get("optimizers")
            if arm.round is None and arm.to_fraction is None:  # a point on the curve has no best round
                best[seed], evaluated[seed] = best_value(folder, arm.metric), evaluations(folder, arm.metric)
                picked_on[seed] = best_picked_on(folder, arm.metric)
        arms[arm.label] = _arm_result(arm, per_seed, best, evaluated, picked_on)
        if configs[arm.label]:
            arms[arm.label]["receipt"] = receipt(configs[arm.label], [arm.metric], _read_at(arm), set_up)
    tests = [_test_result(test, arms, claim.seeds) for test in claim.tests]
    return arms, tests, differences([c[0] for c in configs.values() if c])


def _read_at(arm: Arm) -> str:
    if arm.to_fraction is not None:
        return f"each round's client mean (to {arm.to_fraction:.0%} of the final)"
    if arm.round is None:
        return "final"
    return f"round {arm.round}" if arm.round >= 1 else f"{arm.round:g} of the rounds"


def evaluate_claim(claim: Claim, paper: Paper, scale: str, runs_dir: Path, folders: dict[str, str]) -> dict:
    """The claim over its own seeds 0..claim.seeds-1 (whatever of them have finished), at each setting the paper
    reads it at (``Paper.settings``): with more than one, each arm and test is labelled with its setting."""
    settings = paper.settings_of(claim, scale)
    many = len(settings) > 1
    arms_out: list[dict] = []
    tests_out: list[dict] = []
    per_setting: list[dict] = []
    diffs: list[str] = []
    for setting in settings:
        arms, tests, differ = _evaluate_at(claim, paper, scale, runs_dir, folders, setting)
        tag = f" [{setting.label}]" if many else ""
        arms_out += [{**arm, "label": arm["label"] + tag, "setting": setting.label} for arm in arms.values()]
        tests_out += [{**t, "text": t["text"] + tag, "setting": setting.label, "counts": setting.counts}
                      for t in tests]
        verdict = claim_verdict(tests, pending=any(seeds_missing(t) for t in tests))
        per_setting.append({"label": setting.label, "counts": setting.counts, "verdict": verdict})
        diffs = diffs or differ
    pending = any(seeds_missing(t) for t in tests_out if t["counts"])
    verdict = combined_verdict([s["verdict"] for s in per_setting if s["counts"]], pending)
    return {"id": claim.id, "title": claim.title, "paper_says": claim.paper_says, "regime": claim.regime,
            "paper_number": claim.paper_number, "seeds": claim.seeds, "counts": claim.counts,
            "outside": claim.outside, "explanation": claim.explanation, "peer_gap": claim.peer_gap,
            "arms": arms_out, "tests": tests_out,
            "settings": per_setting if many else [], "verdict": verdict, "differences": diffs}


def seeds_missing(test: dict) -> bool:
    """A test some of whose fixed seeds (at least the 2 an interval needs) have not finished; results written
    before claims fixed their seeds count 2."""
    return len(test["seeds"]) < max(2, test.get("seeds_fixed", 2))


def evaluate(paper: Paper, claims: tuple[Claim, ...], scale: str, seeds: int | None, runs_dir: Path,
             command: str, folders: dict[str, str]) -> dict:
    """Everything REPRODUCTION.md says about one paper at one scale, recomputed from the run folders;
    ``command`` is the one that regenerates them; ``folders`` maps each run key to the run holding it. Each claim
    is read over its own seeds; ``seeds`` is the command's cap (None: none), recorded, and the run count is of
    every run the claims fix, so a capped suite shows what it left."""
    wanted: dict[str, int] = {}
    for key, n in paper.seeds_of(claims, scale).items():
        wanted[folders[key]] = max(wanted.get(folders[key], 0), n)
    folders_run = [runs_dir / run_name(paper, scale, key, s) for key in sorted(wanted) for s in range(wanted[key])]
    done = [folder for folder in folders_run if read_summary(folder) is not None]
    cpu = [seconds for folder in done if (seconds := run_cpu_seconds(folder)) is not None]
    return {"paper": paper.key, "title": paper.title, "scale": scale, "scale_note": paper.scale_notes.get(scale, ""),
            "seeds": seeds, "command": command, "runs_total": len(folders_run), "runs_done": len(done),
            "compute_seconds": sum(run_seconds(folder) for folder in done),
            "compute_cpu_seconds": sum(cpu), "compute_cpu_runs": len(cpu),
            "claims": [evaluate_claim(c, paper, scale, runs_dir, folders) for c in claims]}
