"""`fedsim reproduce privacy`: the claim's runs and arms, its verdicts from synthetic run folders (reproduced and
not reproduced), the docs/privacy.md section they write, and the dry run's count of runs."""
import json
from pathlib import Path

import pytest

from conftest import make_run
from fedsim.cli.main import main
from fedsim.reproduce.privacy import EPSILONS, METHODS, PAPER, PERSONALIZED, SEEDS, TESTED, arm_label, run_key
from fedsim.reproduce.privacy_report import END, FIGURE, START, privacy_of_runs, section, write, write_section
from fedsim.reproduce.runner import folder_keys, plan, run_name, run_trees
from fedsim.reproduce.verdicts import FAILS, HOLDS, NOT_REPRODUCED, REPRODUCED, evaluate

Z = {1: 1.93, 2: 1.27, 4: 0.89, 8: 0.65}  # what a summary.json's privacy block says (made up for the test)


def test_every_method_runs_at_every_epsilon_and_the_arms_differ_only_in_the_noise(tmp_path):
    trees = run_trees(PAPER, "cpu")
    assert len(trees) == len(METHODS) * len(EPSILONS) == 20
    assert len(set(folder_keys(trees).values())) == 20  # no two runs share settings
    for method in METHODS:
        inf = trees[run_key(method, None)]
        assert inf.get("privacy") is None  # epsilon = inf: no clipping, no noise
        for eps in (e for e in EPSILONS if e is not None):
            tree = trees[run_key(method, eps)]
            assert tree["privacy"]["target_epsilon"] == eps and tree["privacy"].get("noise_multiplier") is None
            assert {k: v for k, v in tree.items() if k != "privacy"} == {k: v for k, v in inf.items() if k != "privacy"}
    base = trees[run_key("FedAvg", 1)]
    assert base["train"]["weighting"] == "uniform" and base["train"]["sampling"] == "poisson"
    assert base["privacy"]["dp"] == "central"
    planned = plan(PAPER, PAPER.claims, "cpu", None, tmp_path)
    assert len(planned) == 20 * SEEDS and {p.seed for p in planned} == set(range(SEEDS))
    # `--only fedper` runs the four runs its test reads, for every seed: a verdict's runs before the figure's others.
    only = plan(PAPER, (PAPER.claim("fedper"),), "cpu", None, tmp_path)
    assert {p.key for p in only} == {run_key(m, e) for m in ("FedAvg", "FedPer") for e in (None, TESTED)}
    assert len(only) == 4 * SEEDS


def test_each_claim_compares_a_personalized_methods_drop_with_fedavgs():
    assert [c.id for c in PAPER.claims] == [*(m.lower() for m in PERSONALIZED), "noise-matters"]
    for claim, method in zip(PAPER.claims, PERSONALIZED):
        [test] = claim.tests
        assert dict(test.terms) == {arm_label("FedAvg", None): 1.0, arm_label("FedAvg", TESTED): -1.0,
                                    arm_label(method, None): -1.0, arm_label(method, TESTED): 1.0}
        assert claim.counts and claim.seeds == SEEDS >= 3
    assert PAPER.claim("fedbabu").arm(arm_label("FedBABU", 1)).metric == "acc_personalized"
    setting = PAPER.claim("noise-matters")  # every run, read for the table and the figure; outside the tally
    assert not setting.counts and {a.run for a in setting.arms} == set(PAPER.runs)
    assert {label for label, _ in setting.tests[0].terms} == {arm_label("FedAvg", eps) for eps in EPSILONS}


def _runs(root: Path, accuracy) -> Path:
    """A finished run folder for every planned run: ``accuracy(method, eps, seed)`` in points, the same for its 3
    clients; its summary.json's privacy block as the accountant writes it."""
    folders = folder_keys(run_trees(PAPER, "cpu"))
    for method, (_, metric) in METHODS.items():
        for eps in EPSILONS:
            for seed in range(SEEDS):
                acc = [accuracy(method, eps, seed) / 100] * 3
                run = make_run(root, run_name(PAPER, "cpu", folders[run_key(method, eps)], seed), method.lower(),
                               [acc], personalized=[acc] if metric == "acc_personalized" else None, seed=seed)
                summary = json.loads((run / "summary.json").read_text())
                summary[f"per_client_{metric}"] = dict(enumerate(acc))
                if eps is not None:
                    summary["privacy"] = {"epsilon": eps * 0.999, "delta": 1.07e-3, "noise_multiplier": Z[eps]}
                (run / "summary.json").write_text(json.dumps(summary))
    return root


def _evaluate(runs: Path) -> dict:
    return evaluate(PAPER, PAPER.claims, "cpu", None, runs, "fedsim reproduce privacy --scale cpu",
                    folder_keys(run_trees(PAPER, "cpu")))


def _dp_config(runs: Path):
    """The config the section states the setting from, as the command picks it: FedAvg at the tested epsilon."""
    return next(p.config for p in plan(PAPER, PAPER.claims, "cpu", 1, runs) if p.key == run_key("FedAvg", TESTED))


def personalization_helps(method: str, eps: float | None, seed: int) -> float:
    """FedAvg falls from 40 to 10 points at epsilon 1; the personalized methods only from 65 to 60."""
    if method == "FedAvg":
        return (40.0 if eps is None else 10.0 + eps) + seed
    return (65.0 if eps is None else 60.0 + eps / 10) + seed / 2


def personalization_hurts(method: str, eps: float | None, seed: int) -> float:
    """The opposite: FedAvg loses 3 points, the personalized methods 40."""
    if method == "FedAvg":
        return (40.0 if eps is None else 37.0) + seed
    return (65.0 if eps is None else 25.0) + seed / 2


@pytest.mark.parametrize("accuracy, test_verdict, claim_verdict", [
    (personalization_helps, HOLDS, REPRODUCED), (personalization_hurts, FAILS, NOT_REPRODUCED)])
def test_the_verdict_follows_the_drops_either_way(tmp_path, accuracy, test_verdict, claim_verdict):
    results = _evaluate(_runs(tmp_path, accuracy))
    assert results["runs_done"] == results["runs_total"] == 20 * SEEDS
    for claim, method in zip(results["claims"], PERSONALIZED):
        [test] = claim["tests"]
        drops = [(accuracy("FedAvg", None, s) - accuracy("FedAvg", TESTED, s))
                 - (accuracy(method, None, s) - accuracy(method, TESTED, s)) for s in range(SEEDS)]
        assert test["values"] == pytest.approx(drops)  # paired by seed, in points
        assert test["verdict"] == test_verdict and claim["verdict"] == claim_verdict
    if accuracy is personalization_helps:  # FedAvg at 11..18 points for epsilon 1..8, 40 without DP: noise matters
        assert results["claims"][-1]["verdict"] == REPRODUCED


def test_the_section_shows_each_arm_each_calibrated_z_and_the_tests(tmp_path):
    runs = _runs(tmp_path / "runs", personalization_helps)
    folders = folder_keys(run_trees(PAPER, "cpu"))
    results = _evaluate(runs)
    spent = privacy_of_runs(PAPER, "cpu", runs, folders, SEEDS)
    assert spent["1"]["noise_multiplier"] == [Z[1]] and spent["8"]["delta"] == [1.07e-3]  # once, not per run
    config = _dp_config(runs)
    page = tmp_path / "docs" / "privacy.md"
    page.parent.mkdir()
    page.write_text("# Privacy\n\n## User-level DP: what is clipped and noised\n\nTheirs.\n")
    written = write(results, spent, config, page, tmp_path / "docs" / "images")
    text = page.read_text()
    assert written == [tmp_path / "docs" / "images" / FIGURE, page] and written[0].stat().st_size > 0
    assert text.startswith("# Privacy\n\n## User-level DP: what is clipped and noised\n\nTheirs.\n")  # kept
    # FedAvg at epsilon 1 over seeds 0..2: 11, 12, 13 -> 12.0 [9.5, 14.5]; FedPer at inf: 65, 65.5, 66 -> 65.5.
    assert "| FedAvg (initial) | 12.0 [9.5, 14.5] |" in text and "| 65.5 [64.3, 66.7] |" in text
    assert "| FedBABU (personalized) |" in text
    assert "| noise multiplier z (calibrated) | 1.93 | 1.27 | 0.89 | 0.65 | no noise |" in text
    assert "δ = 0.00107 (1/N^1.1)" in text and "500 clients" in text
    assert text.count("**holds**") == 4 and "(a check of the setting, outside the tally)" in text
    assert f"![accuracy against epsilon per method](images/{FIGURE})" in text
    # Again: the section is replaced between its markers, not appended.
    write(results, spent, config, page, tmp_path / "docs" / "images")
    assert page.read_text() == text and text.count(START) == text.count(END) == 1


def test_a_section_goes_between_the_markers_or_under_its_heading(tmp_path):
    page = tmp_path / "privacy.md"
    write_section(page, f"{START}\none\n{END}")
    assert page.read_text().startswith("# Privacy\n\n## Does personalization") and "one" in page.read_text()
    page.write_text(f"# Privacy\n\nbefore\n\n{START}\nold\n{END}\n\nafter\n")
    write_section(page, f"{START}\nnew\n{END}")
    assert page.read_text() == f"# Privacy\n\nbefore\n\n{START}\nnew\n{END}\n\nafter\n"


def test_without_finished_runs_the_section_says_so_and_draws_nothing(tmp_path):
    results = _evaluate(tmp_path / "none")
    config = _dp_config(tmp_path)
    text = section(results, {}, config, "")
    assert f"0 of {20 * SEEDS} runs finished" in text and "![" not in text
    assert text.count("| - | - | - | - | - |") == 4  # every method's row empty
    stale = tmp_path / "images" / FIGURE
    stale.parent.mkdir()
    stale.write_bytes(b"drawn from runs that are gone")
    write(results, {}, config, tmp_path / "privacy.md", stale.parent)
    assert not stale.exists()


def test_the_dry_run_counts_every_run_and_starts_none(tmp_path, data_root, capsys):
    assert main(["reproduce", "privacy", "--dry-run", "--runs", str(tmp_path / "runs"), "--kept",
                 str(tmp_path / "kept"), f"data.root={data_root}"]) == 0
    out = capsys.readouterr().out
    statuses = [line for line in out.splitlines() if line.endswith(": new")]
    assert len(statuses) == 20 * SEEDS and f"all {20 * SEEDS} runs:" in out
    assert out.count("privacy-cpu-") == 20 + 20 * SEEDS  # seed 0's estimates, then every run's status
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_unknown_claim_is_one_line_exit_2(tmp_path, capsys):
    assert main(["reproduce", "privacy", "--only", "fedrep", "--dry-run", "--runs", str(tmp_path),
                 "--kept", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--only" in err and "ditto" in err
