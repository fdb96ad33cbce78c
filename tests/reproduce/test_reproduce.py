"""`fedsim reproduce`: claim statistics, verdict rules, and one tiny claim end to end (run folders ->
report numbers, skip when finished, resume when interrupted)."""
import json
import math
from pathlib import Path

import pytest

from conftest import TESTS
from fedsim.cli.main import main
from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import greater
from fedsim.reproduce.report import (FAILS, HOLDS, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, _claim_section,
                                     _test_result, claim_verdict, headline_block)
from fedsim.reproduce.runner import execute, folder_keys, plan, run_trees
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
    ([30.0, 10.0, 20.0], [20.0, 20.0, 20.0], INCONCLUSIVE),  # the interval straddles 0
])
def test_a_test_holds_fails_or_is_inconclusive(a, b, verdict):
    result = _test_result(greater("A", "B"), _arms(A=a, B=b))
    assert result["verdict"] == verdict
    assert result["values"] == [x - y for x, y in zip(a, b)]  # paired by seed


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
    assert main(["reproduce", paper, "--scale", scale, "--dry-run", "--runs", str(tmp_path), "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    runs = len(set(folder_keys(run_trees(PAPERS[paper], scale)).values()))
    statuses = [line for line in out.splitlines() if line.endswith(": new")]
    assert len(statuses) == 2 * runs and not any(tmp_path.iterdir())
    assert out.count(f"{paper}-{scale}-") == 3 * runs  # estimates of seed 0, then statuses


def test_runs_with_the_same_settings_at_a_scale_share_one_folder():
    """FedPer's K_P = 1 arm is the base run on the 4-conv CNN; at paper scale (base K_P = 2) it is a run of its own."""
    cpu, paper = (folder_keys(run_trees(PAPERS["fedper"], scale)) for scale in ("cpu", "paper"))
    assert cpu["kp1"] == "k4-fedper" and cpu["kp2"] == "kp2"
    assert paper["kp1"] == "kp1" and paper["kp2"] == "k4-fedper"


def test_unknown_claim_is_one_line_exit_2(tmp_path, capsys):
    assert main(["reproduce", "fedper", "--only", "nope", "--runs", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--only" in err and "k4" in err


def _client_mean(run_dir: Path) -> float:
    values = json.loads((run_dir / "summary.json").read_text())["per_client_acc"].values()
    return 100 * sum(values) / len(values)


@pytest.mark.slow
def test_a_tiny_claim_end_to_end(tmp_path, data_root, capsys):
    runs, report = tmp_path / "runs", tmp_path / "REPRODUCTION.md"
    argv = ["reproduce", "fedper", "--only", "k4", "--seeds", "2", "--runs", str(runs), "--report", str(report),
            f"data.root={data_root}", *TINY]
    assert main(argv) == 0
    results = json.loads((tmp_path / "reproduction" / "fedper-cpu.json").read_text())
    [k4] = [c for c in results["claims"] if c["id"] == "k4"]
    markdown = report.read_text()
    # The report's numbers are those recomputed here from the run folders.
    means = {}
    for arm in PAPERS["fedper"].claim("k4").arms:
        means[arm.label] = [_client_mean(runs / f"fedper-cpu-{arm.run}-s{seed}") for seed in (0, 1)]
        [reported] = [a for a in k4["arms"] if a["label"] == arm.label]
        assert reported["per_seed_mean"] == pytest.approx(means[arm.label], abs=1e-9)
        est = mean_ci(means[arm.label])
        assert f"| {arm.label} | initial | {est.mean:.2f} [{est.low:.2f}, {est.high:.2f}] | 2 |" in markdown
    gap = mean_ci([p - a for p, a in zip(means["FedPer"], means["FedAvg"])])
    assert k4["tests"][0]["estimate"]["mean"] == pytest.approx(gap.mean)
    assert f"| FedPer − FedAvg > 10 | {gap.mean:+.2f} [{gap.low:.2f}, {gap.high:.2f}] | 2 |" in markdown
    assert (tmp_path / "reproduction" / "fedper-cpu-k4.png").stat().st_size > 0
    assert "train.rounds=2" in markdown  # the report says how these runs were cut

    # Again: every run is finished and skipped. An interrupted run (no summary yet) resumes to the same numbers.
    interrupted = runs / "fedper-cpu-k4-fedper-s1"
    (interrupted / "summary.json").unlink()
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("finished, skipped") == 3 and "fedper-cpu-k4-fedper-s1: resuming" in out
    assert _client_mean(interrupted) == pytest.approx(means["FedPer"][1], abs=0)
    assert headline_block(report.read_text()) == headline_block(markdown)


def test_readme_shows_the_reports_headline():
    root = TESTS.parent
    assert headline_block((root / "README.md").read_text()) == headline_block((root / "REPRODUCTION.md").read_text())


def test_an_upper_bound_is_shown_as_the_arms_value():
    from fedsim.reproduce.claims import at_most

    result = _test_result(at_most("FedAvg", 20), _arms(FedAvg=[10.0, 11.0, 12.0]))
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

    from fedsim.cli.main import _time_left
    from fedsim.reproduce.runner import run_seconds

    done, left = tmp_path / "done", tmp_path / "left"
    done.mkdir()
    # A resume truncates rounds.jsonl to its checkpoint, so each round is there once, whatever the invocations.
    (done / "rounds.jsonl").write_text('{"round": 1, "seconds": 30.0}\n{"round": 2, "seconds": 20.0}\n')
    assert run_seconds(done) == 50.0 and run_seconds(left) == 0.0
    states = [(SimpleNamespace(key="a", folder=done), "finished"), (SimpleNamespace(key="b", folder=left), "new")]
    line = _time_left(states, {"a": 100_000, "b": 360_000})
    assert line.startswith("left: 1 runs, 360,000 sample-steps; about 0.1 h at the 2,000 sample-steps/s")


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
