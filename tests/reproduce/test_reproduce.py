"""`fedsim reproduce`: claim statistics, verdict rules, and one tiny claim end to end (run folders ->
report numbers, skip when finished, resume when interrupted)."""
import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import TESTS
from fedsim.cli.main import main
from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import MARGIN, at_most, gap_trend, greater, slope_coefficients, trend
from fedsim.reproduce.report import _claim_section, _progress, headline_block, headline_rows, tally, write_results
from fedsim.reproduce.runner import execute, folder_keys, plan, run_trees
from fedsim.reproduce.verdicts import (DEPENDS, FAILS, HOLDS, INCONCLUSIVE, NO_EFFECT, NOT_REPRODUCED, REPRODUCED,
                                       _arm_result, _test_result, claim_verdict, combined_verdict)
from fedsim.sweep.runs import claimed
from fedsim.metrics.confidence import mean_ci, t975

# A few images per client and one short round: minutes for the whole claim on 2 cores.
TINY = ["train.rounds=2", "train.local_epochs=1", "data.train_fraction=0.02", "data.test_fraction=0.05"]


def test_t_quantiles_and_interval():
    assert t975(2) == 4.303 and abs(t975(31) - 2.0395) < 1e-3 and abs(t975(1000) - 1.9623) < 1e-3
    est = mean_ci([1.0, 2.0, 3.0])
    assert est.mean == 2.0 and math.isclose(est.high - est.mean, 4.303 / math.sqrt(3))
    assert mean_ci([5.0]).low is None


def _arms(**per_seed: list[float]) -> dict:
    return {label: {"seeds": list(range(len(v))), "per_seed_mean": v, "per_seed_std": v} for label, v in per_seed.items()}


@pytest.mark.parametrize("a, b, verdict", [
    ([30.0, 31.0, 32.0], [10.0, 11.5, 12.0], HOLDS),  # +20 points, tight
    ([10.0, 11.0, 12.0], [30.0, 31.5, 32.0], FAILS),
    ([30.0, 10.0, 20.0], [20.0, 20.0, 20.0], INCONCLUSIVE),  # the interval straddles 0 and the margin
])
def test_a_test_holds_fails_or_is_inconclusive(a, b, verdict):
    result = _test_result(greater("A", "B"), _arms(A=a, B=b), seeds=3)
    assert result["verdict"] == verdict
    assert result["values"] == [x - y for x, y in zip(a, b)]  # paired by seed


NULL = [0.5, -0.3, 0.2, 0.1, -0.4]  # a true null: mean 0.02, interval about [-0.42, 0.46]


@pytest.mark.parametrize("diff, by, margin, verdict", [
    (NULL, 0.0, MARGIN, NO_EFFECT),  # below 0 + 2, not below 0: any effect is smaller than the smallest that counts
    (NULL, 0.0, 0.0, INCONCLUSIVE),  # without a margin a null can never be told apart
    ([-1.0, -1.2, -0.9, -1.1, -1.0], 0.0, MARGIN, FAILS),  # wholly below 0: the opposite direction
    ([1.0, 1.2, 0.9, 1.1, 1.0], 0.0, MARGIN, HOLDS),  # real but under the margin: the direction holds
    ([-1.0, 3.0, 1.0, 4.0, 0.0], 0.0, MARGIN, INCONCLUSIVE),  # [-1.17, 3.97]: straddles both 0 and 2
    ([11.0, 11.5, 10.5, 11.2, 10.8], 10.0, MARGIN, HOLDS),  # "> 10": low 10.5 > 10
    ([10.5, 11.0, 11.5, 11.2, 10.8], 10.0, 3.0, HOLDS),
    ([8.0, 9.0, 10.0, 9.5, 8.5], 10.0, MARGIN, FAILS),  # [8.2, 9.8]: wholly below 10
    ([10.0, 10.5, 11.0, 10.2, 10.3], 10.0, MARGIN, NO_EFFECT),  # [9.8, 10.8]: below 10 + 2, not below 10
    ([10.0, 12.0, 11.0, 13.0, 11.0], 10.0, MARGIN, INCONCLUSIVE),  # [9.98, 12.82]: straddles 10 and 12
])
def test_the_equivalence_margin_tells_a_null_from_a_failure(diff, by, margin, verdict):
    result = _test_result(greater("A", "B", by=by, margin=margin), _arms(A=diff, B=[0.0] * len(diff)), seeds=5)
    est = mean_ci(diff)
    assert result["verdict"] == verdict, (est.low, est.high)
    assert result["margin"] == margin


def test_what_would_fail_a_test_is_written_from_it():
    assert greater("FedPer", "FedAvg", by=10).fails_if() == ("fails if the interval of FedPer − FedAvg lies below +10; "
                                                          "no effect ≥ margin if it lies below +12 (10 + margin 2)")
    assert at_most("FedAvg", 20).fails_if() == ("fails if the interval of FedAvg lies above 20; no effect ≥ margin if "
                                                "it lies above 18 (20 − margin 2)")
    assert trend(("a", "b", "c")).fails_if() == (
        "fails if the interval of the slope over a → b → c lies below +0 per step; no effect ≥ margin if it lies "
        "below +1 (0 + margin 2 over 2 steps)")


def test_an_upper_bound_fails_when_the_arm_is_not_below_it_by_the_margin():
    assert _test_result(at_most("FedAvg", 20), _arms(FedAvg=[25.0, 26.0, 27.0]), seeds=3)["verdict"] == FAILS
    assert _test_result(at_most("FedAvg", 20), _arms(FedAvg=[18.5, 19.0, 19.5]), seeds=3)["verdict"] == INCONCLUSIVE


def test_a_claim_is_undecided_until_every_seed_it_fixes_has_finished():
    arms = _arms(A=[30.0, 31.0, 32.0], B=[10.0, 11.5, 12.0])
    assert _test_result(greater("A", "B"), arms, seeds=3)["verdict"] == HOLDS
    early = _test_result(greater("A", "B"), arms, seeds=5)  # 3 of 5 finished: never decided early
    assert early["verdict"] == INCONCLUSIVE and early["estimate"]["mean"] == pytest.approx(19.83, abs=0.01)
    assert early["seeds_fixed"] == 5


# 3 ordered arms x 5 seeds; per seed the least-squares slope on ranks 0, 1, 2 is (x2 - x0) / 2.
LOW, MID, HIGH = [10.0, 12.0, 11.0, 9.0, 13.0], [14.0, 15.0, 13.5, 12.0, 16.0], [19.0, 18.0, 17.0, 16.0, 20.0]


def test_a_trend_is_the_least_squares_slope_per_seed_by_hand():
    import numpy as np

    assert slope_coefficients(3) == (-0.5, 0.0, 0.5)
    assert sum(slope_coefficients(6)) == pytest.approx(0.0)
    result = _test_result(trend(("low", "mid", "high")), _arms(low=LOW, mid=MID, high=HIGH), seeds=5)
    by_hand = [(h - lo) / 2 for lo, h in zip(LOW, HIGH)]  # 4.5, 3, 3, 3.5, 3.5
    fitted = [np.polyfit([0, 1, 2], [lo, m, h], 1)[0] for lo, m, h in zip(LOW, MID, HIGH)]
    assert result["values"] == pytest.approx(by_hand) and result["values"] == pytest.approx(fitted)
    est = mean_ci(by_hand)
    assert result["estimate"]["mean"] == pytest.approx(3.5) and result["estimate"]["low"] == pytest.approx(est.low)
    assert result["verdict"] == HOLDS  # low 2.62 > 0
    # The same arms read the other way: the slope's interval lies below 0, the opposite direction.
    assert _test_result(trend(("high", "mid", "low")), _arms(low=LOW, mid=MID, high=HIGH), seeds=5)["verdict"] == FAILS
    flat = [x + d for x, d in zip(LOW, [0.3, -0.2, 0.1, 0.0, -0.1])]  # slope about 0 in every seed: below the
    # margin spread over 2 steps (1 per step), not below 0
    assert _test_result(trend(("low", "mid", "flat")), _arms(low=LOW, mid=LOW, flat=flat),
                        seeds=5)["verdict"] == NO_EFFECT
    noisy = [LOW[0] + 8, LOW[1] - 6, LOW[2] + 5, LOW[3] - 4, LOW[4] + 1]
    assert _test_result(trend(("low", "mid", "noisy")), _arms(low=LOW, mid=MID, noisy=noisy),
                        seeds=5)["verdict"] == INCONCLUSIVE


def test_a_trend_of_gaps_is_a_contrast_of_the_paired_arms():
    test = gap_trend((("P10", "A10"), ("P8", "A8"), ("P4", "A4")))
    assert dict(test.terms) == pytest.approx({"P10": -0.5, "A10": 0.5, "P8": 0.0, "A8": 0.0, "P4": 0.5, "A4": -0.5})
    arms = _arms(P10=[56.0] * 2, A10=[62.0] * 2, P8=[60.0] * 2, A8=[55.0] * 2, P4=[71.0, 70.0], A4=[40.0, 41.0])
    # gaps -6, 5, 31 / 29: slope (31 - (-6)) / 2 = 18.5 and (29 + 6) / 2 = 17.5
    assert _test_result(test, arms, seeds=2)["values"] == pytest.approx([18.5, 17.5])


def test_tests_pair_only_the_seeds_every_arm_finished():
    arms = {"A": {"seeds": [0, 1, 2], "per_seed_mean": [5.0, 6.0, 7.0]}, "B": {"seeds": [0, 2], "per_seed_mean": [1.0, 2.0]}}
    result = _test_result(greater("A", "B"), arms)
    assert result["seeds"] == [0, 2] and result["values"] == [4.0, 5.0]
    one_seed = _test_result(greater("A", "B"), {"A": arms["A"], "B": {"seeds": [1], "per_seed_mean": [0.0]}})
    assert one_seed["verdict"] == INCONCLUSIVE  # a single seed never decides a claim


def test_claim_verdict_rule():
    assert claim_verdict([{"verdict": HOLDS}, {"verdict": HOLDS}]) == "reproduced"
    assert claim_verdict([{"verdict": HOLDS}, {"verdict": FAILS}]) == "not reproduced"
    assert claim_verdict([{"verdict": HOLDS}, {"verdict": INCONCLUSIVE}]) == "inconclusive"
    assert claim_verdict([{"verdict": HOLDS}, {"verdict": NO_EFFECT}]) == NO_EFFECT  # never "not reproduced"
    assert claim_verdict([{"verdict": FAILS}, {"verdict": NO_EFFECT}]) == NOT_REPRODUCED
    # With runs left, a test still running may yet fail: no effect waits for them, a failure does not.
    assert claim_verdict([{"verdict": NO_EFFECT}, {"verdict": INCONCLUSIVE}], pending=True) == INCONCLUSIVE
    assert claim_verdict([{"verdict": FAILS}, {"verdict": INCONCLUSIVE}], pending=True) == NOT_REPRODUCED


def test_the_headline_counts_the_runs_left_and_says_when_none_is():
    def results(done: int) -> list[dict]:
        return [{"paper": "p", "scale": "cpu", "claims": [], "runs_done": done, "runs_total": 4,
                 "compute_seconds": 7200.0}]

    assert "p (cpu) 3 of 4 runs. Total compute: 2.0 h" in _progress(results(3))
    assert "; 1 run left (`--dry-run` estimates their time)." in _progress(results(3))
    assert "; no run left." in _progress(results(4)) and "runs left" not in _progress(results(4))


def test_settings_that_decide_a_claim_differently_make_it_depend_on_the_optimizer():
    assert combined_verdict([REPRODUCED, REPRODUCED], pending=False) == REPRODUCED
    assert combined_verdict([NOT_REPRODUCED, NOT_REPRODUCED], pending=False) == NOT_REPRODUCED
    assert combined_verdict([REPRODUCED, NO_EFFECT], pending=False) == DEPENDS
    assert combined_verdict([REPRODUCED, INCONCLUSIVE], pending=False) == DEPENDS  # every seed in: a real difference
    assert combined_verdict([REPRODUCED, INCONCLUSIVE], pending=True) == INCONCLUSIVE  # runs left: not yet
    assert combined_verdict([REPRODUCED], pending=False) == REPRODUCED
    # no setting reproduces it: the worse verdict, never "depends on the optimizer" (issue 65 item 7)
    assert combined_verdict([INCONCLUSIVE, NOT_REPRODUCED], pending=False) == NOT_REPRODUCED
    assert combined_verdict([NO_EFFECT, NOT_REPRODUCED], pending=False) == NOT_REPRODUCED
    assert combined_verdict([INCONCLUSIVE, NO_EFFECT], pending=False) == NO_EFFECT


def test_counts_false_is_shown_with_its_reason_but_left_out_of_the_tally():
    def claim(verdict: str, counts: bool = True, outside: str = "", name: str = "") -> dict:
        test = {"text": "A − B > 0", "seeds": [0, 1, 2, 3, 4], "estimate": None, "verdict": HOLDS}
        return {"id": name or verdict, "title": verdict, "paper_number": "-", "tests": [test], "verdict": verdict,
                "seeds": 5, "counts": counts, "outside": outside}

    results = [{"paper": "p", "scale": "cpu", "claims": [
        claim(REPRODUCED), claim(NOT_REPRODUCED), claim(INCONCLUSIVE), claim(NO_EFFECT), claim(DEPENDS),
        claim(REPRODUCED, counts=False, name="smoke"),
        claim(REPRODUCED, counts=False, outside="a setting the paper does not report", name="extra")]}]
    assert tally(results) == (f"Of 5 claims: 1 reproduced, 1 not reproduced, 1 {NO_EFFECT}, 1 {DEPENDS}, 1 "
                              "inconclusive; outside the tally: `smoke` (smoke check); `extra` (a setting the paper "
                              "does not report).")
    rows = headline_rows(results)
    assert rows[-1].endswith("| 5 of 5 | outside the tally (a setting the paper does not report): reproduced |")
    assert rows[-2].endswith("| 5 of 5 | outside the tally (smoke check): reproduced |")
    assert rows[2].endswith("| 5 of 5 | **reproduced** |")


def test_every_claim_fixes_at_least_5_seeds_and_no_test_repeats_another():
    """A check outside the tally may fix fewer (at least the 2 an interval needs): App. F under Flower's lr."""
    for paper in PAPERS.values():
        seen = {}
        for claim in paper.claims:
            assert claim.seeds >= (5 if claim.counts else 2), claim.id
            for test in claim.tests:
                arm = {a.label: (a.run, a.metric, getattr(a, "round", None)) for a in claim.arms}
                key = (tuple(sorted(((arm[label], coef) for label, coef in test.terms), key=repr)), test.above,
                       test.stat)
                assert key not in seen, f"{claim.id}: {test.text} repeats {seen[key]}"
                seen[key] = f"{claim.id}: {test.text}"
    assert not PAPERS["fedbabu"].claim("pfllib").counts  # a smoke check: 10 of PFLlib's 2,000 rounds


def test_each_claim_plans_its_own_seeds_and_seeds_caps_them(tmp_path, data_root):
    from dataclasses import replace

    paper = PAPERS["fedper"]
    k4 = paper.claim("k4")
    by_key = lambda planned: {key: sorted(p.seed for p in planned if p.key == key) for key in {p.key for p in planned}}
    k4_runs = ("k4-fedavg", "k4-fedper", "k4-fedavg-sgd", "k4-fedper-sgd")  # the last two: plain SGD, untested rows
    assert by_key(plan(paper, (k4,), "cpu", None, tmp_path)) == {key: [0, 1, 2, 3, 4] for key in k4_runs}
    assert by_key(plan(paper, (k4,), "cpu", 2, tmp_path)) == {key: [0, 1] for key in k4_runs}  # at most 2
    three = replace(k4, id="k4-3", seeds=3)  # a run read by two claims gets the most seeds either fixes
    other = replace(paper.claim("k-sweep"), seeds=6)
    planned = by_key(plan(paper, (three, other), "cpu", None, tmp_path))
    assert planned["k4-fedper"] == list(range(6)) and planned["k10-fedper"] == list(range(6))
    assert by_key(plan(paper, (three,), "cpu", None, tmp_path))["k4-fedper"] == [0, 1, 2]


def test_an_arm_shows_the_final_and_the_best_round():
    from fedsim.reproduce.claims import Arm

    per_seed = {0: [0.5, 0.7], 1: [0.6, 0.6], 2: [0.4, 0.6]}
    result = _arm_result(Arm("A", "a"), per_seed, {0: 0.65, 1: 0.7, 2: 0.55})
    assert result["per_seed_mean"] == pytest.approx([60.0, 60.0, 50.0])
    assert result["per_seed_best"] == pytest.approx([65.0, 70.0, 55.0])
    assert result["estimate_best"]["mean"] == pytest.approx(63.333, abs=1e-3)
    test = {**_test_result(greater("A", "A"), {"A": result}, seeds=3), "text": "A − A > 0"}
    claim = {"id": "c", "title": "C", "paper_says": "p", "regime": "r", "arms": [result], "tests": [test],
             "verdict": test["verdict"], "explanation": "", "seeds": 3, "counts": True, "paper_number": "peer 61"}
    section = "\n".join(_claim_section(claim, "cpu", "reproduction"))
    assert "| A | initial | 56.67 [" in section and "| 63.33 [" in section and "best round" in section
    assert "fails if the interval of A − A lies below +0; no effect ≥ margin if it lies below +2 (0 + margin 2)" \
        in section and "peer 61" in section
    assert "| no effect ≥ 2 points: interval [" in section and "Verdict: no effect ≥ margin." in section
    assert "Seeds: 3 of 3 finished" in section
    assert "estimate_best" not in _arm_result(Arm("A", "a"), per_seed, {0: 0.65, 1: None, 2: 0.55})  # old summaries


def test_a_best_round_that_is_the_final_one_by_construction_says_so(tmp_path):
    from fedsim.reproduce.claims import Arm
    from fedsim.reproduce.report import _best_cell
    from fedsim.reproduce.verdicts import evaluations

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"round": 1}, {"round": 2, "acc": {"mean": 0.4}}, {"round": 3, "acc": {}, "acc_personalized": {}}]
    (run / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert evaluations(run, "acc") == 2 and evaluations(run, "acc_personalized") == 1

    per_seed, best = {0: [0.5, 0.7], 1: [0.6, 0.6]}, {0: 0.6, 1: 0.6}
    once = _arm_result(Arm("A", "a"), per_seed, best, {0: 1, 1: 1})  # FedBABU's protocol: one evaluation, at the end
    assert once["best_is_final"] and "estimate_best" not in once and _best_cell(once) == "= final (evaluated once)"
    some = _arm_result(Arm("A", "a"), per_seed, best, {0: 1, 1: 20})  # one seed had more rounds to choose from
    assert "best_is_final" not in some and _best_cell(some) == "60.00 [60.00, 60.00] (on test)"
    picked = _arm_result(Arm("A", "a"), per_seed, best, {0: 1, 1: 20}, {0: "validation", 1: "validation"})
    assert _best_cell(picked) == "60.00 [60.00, 60.00]"  # data.validation picked it: a selection, unmarked
    halfway = _arm_result(Arm("A", "a", round=0.5), per_seed)  # the run's best round is not this point's
    assert "estimate_best" not in halfway and _best_cell(halfway) == "- (a point of the curve)"
    assert _best_cell(_arm_result(Arm("A", "a", round=0.5), per_seed, best, {0: 1, 1: 1})) == "- (a point of the curve)"


def test_every_claim_sets_a_number_beside_fedsims_or_says_why_there_is_none():
    for paper in PAPERS.values():
        for claim in paper.claims:
            assert claim.paper_number != "-", f"{paper.key} {claim.id}: name the paper's or a peer's number, or why none"


def test_every_claim_names_existing_runs_and_arms():
    for paper in PAPERS.values():
        for claim in paper.claims:
            labels = [arm.label for arm in claim.arms]
            assert len(set(labels)) == len(labels), claim.id
            assert all(arm.run in paper.runs for arm in claim.arms), claim.id
            assert all(label in labels for test in claim.tests for label, _ in test.terms), claim.id


@pytest.mark.parametrize("paper", sorted(PAPERS))
@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_run_of_both_scales_validates(paper, scale, tmp_path, data_root, capsys):
    """The dry run builds each run's partition and model (seed 0) and prints its work, without running it."""
    assert main(["reproduce", paper, "--scale", scale, "--dry-run", "--runs", str(tmp_path), "--seeds", "2",
                 "--kept", str(tmp_path / "kept")]) == 0
    out = capsys.readouterr().out
    folders = folder_keys(run_trees(PAPERS[paper], scale))
    runs = len({folders[key] for key in PAPERS[paper].runs_of(PAPERS[paper].claims, scale)})
    statuses = [line for line in out.splitlines() if line.endswith(": new")]
    assert len(statuses) == 2 * runs and not any(tmp_path.iterdir())
    assert out.count(f"{paper}-{scale}-") == 3 * runs  # estimates of seed 0, then statuses


def test_runs_with_the_same_settings_at_a_scale_share_one_folder():
    """FedPer's K_P = 1 arm is the base run on the 4-conv CNN; at paper scale (base K_P = 2) it is a run of its own."""
    cpu, paper = (folder_keys(run_trees(PAPERS["fedper"], scale)) for scale in ("cpu", "paper"))
    assert cpu["kp1"] == "k4-fedper" and cpu["kp2"] == "kp2"
    assert paper["kp1"] == "kp1" and paper["kp2"] == "k4-fedper"


def test_unknown_claim_is_one_line_exit_2(tmp_path, capsys):
    assert main(["reproduce", "fedper", "--only", "nope", "--runs", str(tmp_path), "--dry-run",
                 "--kept", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--only" in err and "k4" in err


def _client_mean(run_dir: Path) -> float:
    values = json.loads((run_dir / "summary.json").read_text())["per_client_acc"].values()
    return 100 * sum(values) / len(values)


@pytest.mark.slow
def test_a_tiny_claim_end_to_end(tmp_path, data_root, capsys):
    runs, report = tmp_path / "runs", tmp_path / "REPRODUCTION.md"
    argv = ["reproduce", "fedper", "--only", "k4", "--seeds", "2", "--runs", str(runs), "--report", str(report),
            "--kept", str(tmp_path / "kept"),
            f"data.root={data_root}", *TINY]
    assert main(argv) == 0
    results = json.loads((tmp_path / "reproduction" / "fedper-cpu.json").read_text())
    [k4] = [c for c in results["claims"] if c["id"] == "k4"]
    markdown = report.read_text()
    # The report's numbers are those recomputed here from the run folders, at each of the claim's settings (the
    # paper's plain SGD, counted, and the CPU base's momentum 0.9, context).
    paper = PAPERS["fedper"]
    claim = paper.claim("k4")
    settings = paper.settings_of(claim, "cpu")
    assert [s.counts for s in settings] == [True, False]
    means = {}
    for setting in settings:
        for arm in claim.arms:
            label = f"{arm.label} [{setting.label}]"
            means[label] = [_client_mean(runs / f"fedper-cpu-{arm.run}{setting.suffix}-s{seed}") for seed in (0, 1)]
            [reported] = [a for a in k4["arms"] if a["label"] == label]
            assert reported["per_seed_mean"] == pytest.approx(means[label], abs=1e-9)
            est = mean_ci(means[label])
            assert f"| {label} | initial | {est.mean:.2f} [{est.low:.2f}, {est.high:.2f}] | " in markdown
    sgd = settings[0].label
    gap = mean_ci([p - a for p, a in zip(means[f"FedPer [{sgd}]"], means[f"FedAvg [{sgd}]"])])
    assert k4["tests"][0]["estimate"]["mean"] == pytest.approx(gap.mean) and k4["tests"][0]["counts"]
    assert (f"| FedPer − FedAvg > 10 [{sgd}] | {gap.mean:+.2f} [{gap.low:.2f}, {gap.high:.2f}] | 2 | fails if the "
            "interval of FedPer − FedAvg lies below +10; no effect ≥ margin if it lies below +12 (10 + margin 2) | "
            "inconclusive |") in markdown  # 2 of its 5 seeds
    assert k4["verdict"] == INCONCLUSIVE and "Seeds: 2 of 5 finished" in markdown
    assert (tmp_path / "reproduction" / "fedper-cpu-k4.png").stat().st_size > 0
    assert "train.rounds=2" in markdown  # the report says how these runs were cut
    # Its compute: the rounds' wall time and, recorded by every run, their CPU time.
    assert results["compute_cpu_runs"] == results["runs_done"] == 8 and results["compute_cpu_seconds"] > 0
    cpu_hours = f"{results['compute_cpu_seconds'] / 3600:.1f} CPU-core hours over the 8 of them that recorded"
    assert markdown.count(cpu_hours) == 2  # the headline's total and the paper's section
    # Each arm's receipt, from its runs' stored configs, and what else than the method the arms differ in.
    receipts = {arm["label"]: arm["receipt"] for arm in k4["arms"]}
    assert receipts[f"FedPer [{sgd}]"]["seeds"] == "0, 1" and receipts[f"FedPer [{sgd}]"]["rounds"] == "2"
    assert receipts[f"FedAvg [{sgd}]"]["round"].startswith("final; best round on test")
    assert "algorithm.name" in k4["differences"] and "seed" not in k4["differences"]
    assert f"| FedPer [{sgd}] | fedper" in markdown and f"The arms differ in: {', '.join(k4['differences'])}." in markdown

    # Again: every run is finished and skipped. An interrupted run (no summary yet) resumes to the same numbers.
    interrupted = runs / "fedper-cpu-k4-fedper-sgd-s1"
    (interrupted / "summary.json").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    k4_runs = 2 * len(paper.runs_of((claim,), "cpu"))  # 2 seeds of each of its runs, at both settings
    assert k4_runs == 8
    assert out.count("finished, skipped") == k4_runs - 1 and "fedper-cpu-k4-fedper-sgd-s1: resuming" in out
    assert _client_mean(interrupted) == pytest.approx(means[f"FedPer [{sgd}]"][1], abs=0)
    [k4_after] = [c for c in json.loads((tmp_path / "reproduction" / "fedper-cpu.json").read_text())["claims"]
                  if c["id"] == "k4"]
    assert headline_block(report.read_text()) == headline_block(markdown)

    # On a machine without the run folders: the kept runs are put back, none runs again, the results are the same.
    shutil.rmtree(runs)
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{k4_runs} finished runs put back from {tmp_path / 'kept'}" in out
    assert out.count("finished, skipped") == k4_runs
    again = json.loads((tmp_path / "reproduction" / "fedper-cpu.json").read_text())
    assert [c for c in again["claims"] if c["id"] == "k4"] == [k4_after]


def test_readme_shows_the_reports_headline():
    root = TESTS.parent
    assert headline_block((root / "README.md").read_text()) == headline_block((root / "REPRODUCTION.md").read_text())


def test_an_upper_bound_is_shown_as_the_arms_value():
    result = _test_result(at_most("FedAvg", 20), _arms(FedAvg=[10.0, 11.0, 12.0]), seeds=3)
    assert result["verdict"] == HOLDS and result["estimate"]["mean"] == pytest.approx(11.0)
    assert result["estimate"]["low"] < 11.0 < result["estimate"]["high"] < 20


@pytest.mark.parametrize("verdict, seeds, shown", [(REPRODUCED, 3, False), (NOT_REPRODUCED, 3, True),
                                                   (INCONCLUSIVE, 3, True), (INCONCLUSIVE, 1, False)])
def test_the_explanation_is_shown_where_the_seeds_did_not_reproduce_the_claim(verdict, seeds, shown):
    test = {"text": "A − B > 0", "seeds": list(range(seeds)), "estimate": None, "verdict": verdict}
    claim = {"id": "c", "title": "C", "paper_says": "p", "regime": "r", "arms": [], "tests": [test],
             "verdict": verdict, "explanation": "the cut to 10 rounds"}
    assert ("*Why:* the cut to 10 rounds" in _claim_section(claim, "cpu", "reproduction")) == shown


def test_a_run_another_process_holds_is_left_to_it(tmp_path, data_root):
    paper = PAPERS["fedper"]
    [first, *_] = plan(paper, (paper.claim("k4"),), "cpu", 1, tmp_path, [f"data.root={data_root}", *TINY])
    said = []
    with claimed(first.config) as mine:  # this process stands in for another `fedsim reproduce` training the run
        assert mine
        execute([first], say=said.append)
    assert said == [f"[1/1] {first.config.name}: another process is running it, skipped"]
    assert not first.folder.exists()
    with claimed(first.config) as mine:  # the lock dies with its holder
        assert mine


def test_a_runs_time_counts_its_rounds_across_resumes_and_the_dry_run_extrapolates(tmp_path):
    from types import SimpleNamespace

    from fedsim.cli.reproduce import _time_left
    from fedsim.reproduce.runner import run_seconds

    done, left = tmp_path / "done", tmp_path / "left"
    done.mkdir()
    # A resume truncates rounds.jsonl to its checkpoint, so each round is there once, whatever the invocations.
    (done / "rounds.jsonl").write_text('{"round": 1, "seconds": 30.0}\n{"round": 2, "seconds": 20.0}\n')
    assert run_seconds(done) == 50.0 and run_seconds(left) == 0.0
    states = [(SimpleNamespace(key="a", folder=done), "finished"), (SimpleNamespace(key="b", folder=left), "new")]

    def untimed() -> None:
        pytest.fail("timed steps asked for where finished runs measured the rate")

    line = _time_left(states, {"a": 100_000, "b": 360_000}, untimed)
    assert line.startswith("left: 1 runs, 360,000 sample-steps; about 0.1 h at the 2,000 sample-steps/s")
    assert "CPU" not in line  # no finished run recorded its CPU time
    line = _time_left(states[1:], {"b": 360_000}, lambda: 100.0)  # nothing finished: a few steps timed here
    assert line.startswith("left: 1 runs, 360,000 sample-steps; about 1.0 h of training and fine-tuning at the 100 "
                           "sample-steps/s the first run left trained at in a few steps timed here")
    (done / "rounds.jsonl").write_text('{"round": 1, "seconds": 30.0, "cpu_seconds": 10.0}\n'
                                       '{"round": 2, "seconds": 20.0, "cpu_seconds": 10.0}\n')
    line = _time_left(states, {"a": 100_000, "b": 3_600_000}, untimed)
    assert line.endswith("; about 0.2 CPU-core hours at the 5,000 sample-steps per CPU-second the 1 of them that "
                         "recorded their CPU time measured")
    # Another seed of run "a" (the same key): a run of its own, counted and timed as one.
    other_seed = tmp_path / "other-seed"
    other_seed.mkdir()
    (other_seed / "rounds.jsonl").write_text('{"round": 1, "seconds": 30.0, "cpu_seconds": 100.0}\n')
    line = _time_left([*states, (SimpleNamespace(key="a", folder=other_seed), "finished")],
                      {"a": 100_000, "b": 3_600_000}, untimed)
    assert line.endswith("; about 0.6 CPU-core hours at the 1,667 sample-steps per CPU-second the 2 of them that "
                         "recorded their CPU time measured")


def test_max_concurrent_hands_every_planned_run_to_one_tune_sweep(tmp_path, data_root, monkeypatch):
    import fedsim.sweep.executor as executor

    paper = PAPERS["fedper"]
    planned = plan(paper, (paper.claim("k4"),), "cpu", 2, tmp_path, [f"data.root={data_root}", *TINY])
    handed = []
    monkeypatch.setattr(executor, "run_sweep", lambda sweep, n, say: handed.append((sweep, n)))
    execute(planned, max_concurrent=3, name="fedper-cpu")
    [(sweep, n)] = handed
    assert n == 3 and sweep.name == "fedper-cpu" and sweep.search.scheduler == "fifo"
    assert [cfg.name for cfg in sweep.configs] == [item.config.name for item in planned]
    assert sweep.folder == str(tmp_path / "_sweeps" / "fedper-cpu")


def test_a_claim_without_finished_runs_loses_an_older_figure(tmp_path):
    stale = tmp_path / "fedper-cpu-k4.png"
    stale.write_bytes(b"drawn from runs that are gone")
    results = {"paper": "fedper", "scale": "cpu", "claims": [{"id": "k4", "arms": [{"label": "FedAvg", "seeds": []}]}]}
    write_results(results, tmp_path)
    assert not stale.exists() and "figure" not in results["claims"][0]


def test_a_claim_at_two_settings_shows_each_verdict_with_both_numbers():
    def test(setting: str, values: list[float], counts: bool = True) -> dict:
        result = _test_result(greater("A", "B"), _arms(A=values, B=[0.0] * len(values)), seeds=5)
        return {**result, "text": f"A − B > 0 [{setting}]", "setting": setting, "counts": counts}

    tests = [test("m 0.9", [5.0, 6.0, 5.5, 6.5, 5.0]), test("plain SGD", [0.3, -0.2, 0.1, 0.0, -0.1])]
    settings = [{"label": "m 0.9", "counts": True, "verdict": claim_verdict(tests[:1])},
                {"label": "plain SGD", "counts": True, "verdict": claim_verdict(tests[1:])}]
    verdict = combined_verdict([s["verdict"] for s in settings], pending=False)
    claim = {"id": "c", "title": "C", "paper_says": "p", "regime": "r", "arms": [], "tests": tests, "seeds": 5,
             "settings": settings, "verdict": verdict, "explanation": "", "counts": True, "paper_number": "-"}
    assert verdict == DEPENDS
    section = "\n".join(_claim_section(claim, "cpu", "reproduction"))
    assert "At m 0.9: reproduced (5 of 5 seeds finished)." in section
    assert f"At plain SGD: {NO_EFFECT} (5 of 5 seeds finished)." in section
    assert f"**Verdict: {DEPENDS}.**" in section and "| no effect ≥ 2 points: interval [" in section
    [row] = headline_rows([{"paper": "p", "scale": "cpu", "claims": [claim]}])[2:]
    assert "+5.60 [" in row and "(m 0.9); +0.02 [" in row and "(plain SGD)" in row and f"**{DEPENDS}**" in row
