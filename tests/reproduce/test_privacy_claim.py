"""`fedsim reproduce privacy`: the claim's runs and arms, its verdicts from synthetic run folders (reproduced and
not reproduced, and a method that ignores the global model failing), the docs/privacy.md section they write, and the
dry run's count of runs."""
import dataclasses
import json
from pathlib import Path

import pytest

from conftest import make_run
from fedsim.cli.main import main
from fedsim.errors import ConfigError
from fedsim.reproduce.privacy import (EPSILONS, LOCAL, LOCAL_RUN, METHODS, PAPER, PERSONALIZED, PRIVATE, PROXY_RUN,
                                      RUN_METHODS, SEEDS, TESTED, arm_label, epsilon_name, run_key)
from fedsim.reproduce.privacy_report import (END, FIGURE, START, clipped_share, privacy_of_runs, proxy_norms, section,
                                             write, write_section)
from fedsim.reproduce.runner import folder_keys, plan, run_name, run_trees
from fedsim.reproduce.verdicts import FAILS, HOLDS, NO_EFFECT, NOT_REPRODUCED, REPRODUCED, evaluate

Z = {1: 1.93, 2: 1.27, 4: 0.89, 8: 0.65}  # what a summary.json's privacy block says (made up for the test)
RUN_COUNT = len(RUN_METHODS) * len(EPSILONS) + 2  # every DP method at every epsilon, Local, the clip norm's proxy


def test_every_method_runs_at_every_epsilon_and_the_arms_differ_only_in_the_noise(tmp_path):
    trees = run_trees(PAPER, "cpu")
    assert len(trees) == RUN_COUNT == 22
    assert len(set(folder_keys(trees).values())) == 22  # no two runs share settings
    for method in RUN_METHODS:
        inf = trees[f"{method}-epsinf"]
        assert inf.get("privacy") is None  # epsilon = inf: no clipping, no noise
        for eps in PRIVATE:
            tree = trees[f"{method}-eps{epsilon_name(eps)}"]
            assert tree["privacy"]["target_epsilon"] == eps and tree["privacy"].get("noise_multiplier") is None
            assert tree["privacy"].get("delta") is None  # the default rule: min(1e-5, 1/N^2)
            assert {k: v for k, v in tree.items() if k != "privacy"} == {k: v for k, v in inf.items() if k != "privacy"}
    assert trees[LOCAL_RUN]["algorithm"] == "local" and trees[LOCAL_RUN].get("privacy") is None
    # FedAvg+FT fine-tunes as FedBABU does at evaluation: the same budget, read from the FedAvg runs.
    assert trees["fedavg-eps1"]["eval"]["finetune_epochs"] == trees["fedbabu-eps1"]["eval"]["finetune_epochs"] == 5
    assert run_key("FedAvg+FT", 1) == run_key("FedAvg", 1)
    proxy, base = trees[PROXY_RUN], trees[run_key("FedAvg", 1)]
    assert proxy["data"]["dataset"] == "cifar100" != base["data"]["dataset"]  # not the evaluated clients' data
    assert proxy["privacy"]["noise_multiplier"] == 0 and proxy["privacy"]["clip_norm"] > 100 * base["privacy"]["clip_norm"]
    assert base["train"]["weighting"] == "uniform" and base["train"]["sampling"] == "poisson"
    assert base["privacy"]["dp"] == "central"
    planned = plan(PAPER, PAPER.claims, "cpu", None, tmp_path)
    assert len(planned) == RUN_COUNT * SEEDS and {p.seed for p in planned} == set(range(SEEDS))
    assert planned[0].key == PROXY_RUN  # the clip norm was read from it before the others ran
    # `--only fedper` runs the runs its tests read, for every seed: a verdict's runs before the figure's others.
    only = plan(PAPER, (PAPER.claim("fedper"),), "cpu", None, tmp_path)
    assert {p.key for p in only} == {run_key("FedAvg+FT", e) for e in (None, TESTED)} | {
        run_key("FedPer", e) for e in EPSILONS} | {LOCAL_RUN}
    assert len(only) == 8 * SEEDS


def test_the_pages_reading_names_only_runs_of_the_paper():
    """report.yaml (the table's methods, Local, the proxy) is checked against paper.yaml's runs as it is read."""
    from fedsim.reproduce.privacy import _report

    without_local = {key: runs for key, runs in PAPER.runs.items() if key != LOCAL_RUN}
    with pytest.raises(ConfigError, match=f"report.yaml: names the run '{LOCAL_RUN}', which paper.yaml does not"):
        _report(dataclasses.replace(PAPER, runs=without_local))


def test_each_claim_tests_the_drop_against_fedavg_ft_and_the_level_against_local():
    assert [c.id for c in PAPER.claims] == [*(m.lower() for m in PERSONALIZED), "noise-matters"]
    for claim, method in zip(PAPER.claims, PERSONALIZED):
        drop, *levels = claim.tests
        assert dict(drop.terms) == {arm_label("FedAvg+FT", None): 1.0, arm_label("FedAvg+FT", TESTED): -1.0,
                                    arm_label(method, None): -1.0, arm_label(method, TESTED): 1.0}
        assert [dict(t.terms) for t in levels] == [{arm_label(method, eps): 1.0, LOCAL: -1.0} for eps in PRIVATE]
        assert claim.counts and claim.seeds == SEEDS >= 3
    assert PAPER.claim("fedbabu").arm(arm_label("FedBABU", 1)).metric == "acc_personalized"
    assert PAPER.claim("fedper").arm(arm_label("FedAvg+FT", 1)).metric == "acc_personalized"
    setting = PAPER.claim("noise-matters")  # every run, read for the table and the figure; outside the tally
    assert not setting.counts and {a.run for a in setting.arms} == set(PAPER.runs)
    assert {label for label, _ in setting.tests[0].terms} == {arm_label("FedAvg", eps) for eps in EPSILONS}


def _runs(root: Path, accuracy) -> Path:
    """A finished run folder for every planned run: ``accuracy(label, eps, seed)`` in points, the same for its 3
    clients (FedAvg's runs carry FedAvg's as initial and FedAvg+FT's as personalized); its summary.json's privacy
    block as the accountant writes it; the proxy's rounds record update norms."""
    folders = folder_keys(run_trees(PAPER, "cpu"))
    reads = {"fedavg": ("FedAvg", "FedAvg+FT"), "fedper": ("FedPer", None), "fedbabu": (None, "FedBABU"),
             "ditto": ("Ditto", None)}
    for seed in range(SEEDS):
        for method, (initial, personal) in reads.items():
            for eps in EPSILONS:
                def accs(label):
                    return [[accuracy(label, eps, seed) / 100] * 3] if label else [[0.1] * 3]
                run = make_run(root, run_name(PAPER, "cpu", folders[f"{method}-eps{epsilon_name(eps)}"], seed),
                               method, accs(initial), personalized=accs(personal) if personal else None, seed=seed)
                summary = json.loads((run / "summary.json").read_text())
                if personal:
                    summary["per_client_acc_personalized"] = dict(enumerate(accs(personal)[0]))
                if eps is not None:
                    summary["privacy"] = {"epsilon": eps * 0.999, "delta": 4e-6, "noise_multiplier": Z[eps]}
                    _record_rounds(run, clip_norm=0.9, clipped_fraction=0.4)
                (run / "summary.json").write_text(json.dumps(summary))
        make_run(root, run_name(PAPER, "cpu", folders[LOCAL_RUN], seed), "local",
                 [[accuracy(LOCAL, None, seed) / 100] * 3], seed=seed)
        proxy = make_run(root, run_name(PAPER, "cpu", folders[PROXY_RUN], seed), "fedavg", [[0.05] * 3] * 3, seed=seed)
        _record_rounds(proxy, clip_norm=1000.0, update_norm_mean=iter((0.8, 0.95 + seed / 100, 1.0)))
    return root


def _record_rounds(run: Path, **privacy) -> None:
    """Each of the run's rounds.jsonl rows given a privacy record (an iterator's values one per round)."""
    rows = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    for row in rows:
        row["privacy"] = {k: next(v) if hasattr(v, "__next__") else v for k, v in privacy.items()}
    (run / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _evaluate(runs: Path) -> dict:
    return evaluate(PAPER, PAPER.claims, "cpu", None, runs, "fedsim reproduce privacy --scale cpu",
                    folder_keys(run_trees(PAPER, "cpu")))


def test_an_arms_receipt_prints_the_optimizer_its_runs_set_up(tmp_path):
    """A run that recorded the optimizers it set up (summary.json's) has them in its arm's receipt, not its config's."""
    runs = _runs(tmp_path, personalization_helps)
    ditto = runs / run_name(PAPER, "cpu", folder_keys(run_trees(PAPER, "cpu"))[run_key("Ditto", 1)], 0)
    summary = json.loads((ditto / "summary.json").read_text())
    summary["optimizers"] = ["full: Adam (optimizer 0, group 0, 6 tensors): lr 0.003, betas (0.9, 0.999), eps 1e-08, "
                             "weight_decay 0"]
    (ditto / "summary.json").write_text(json.dumps(summary))
    arms = {arm["label"]: arm for claim in _evaluate(runs)["claims"] for arm in claim["arms"]}
    adam = arms[arm_label("Ditto", 1)]["receipt"]
    assert (adam["optimizer"], adam["lr"].split(",")[0]) == ("Adam", "0.003")
    assert arms[arm_label("Ditto", 2)]["receipt"]["optimizer"] != "Adam"  # runs that did not record theirs: the config


def _dp_config(runs: Path):
    """The config the section states the setting from, as the command picks it: FedAvg at the tested epsilon."""
    return next(p.config for p in plan(PAPER, PAPER.claims, "cpu", 1, runs) if p.key == run_key("FedAvg", TESTED))


def personalization_helps(label: str, eps: float | None, seed: int) -> float:
    """FedAvg+FT falls from 60 to 30 points at epsilon 1 (FedAvg from 40 to 10); the personalized methods only from
    65 to 60, above Local's 55 at every epsilon."""
    if label == LOCAL:
        return 55.0 + seed / 3
    if label in ("FedAvg", "FedAvg+FT"):
        top = 40.0 if label == "FedAvg" else 60.0
        return (top if eps is None else top - 30.0 + eps) + seed
    return (65.0 if eps is None else 60.0 + eps / 10) + seed / 2


def personalization_hurts(label: str, eps: float | None, seed: int) -> float:
    """The opposite: FedAvg+FT loses 3 points, the personalized methods 40."""
    if label == LOCAL:
        return 30.0
    if label in ("FedAvg", "FedAvg+FT"):
        return (40.0 if eps is None else 37.0) + seed
    return (65.0 if eps is None else 25.0) + seed / 2


def local_in_disguise(label: str, eps: float | None, seed: int) -> float:
    """A method that ignores the global model: flat at every epsilon (it drops less than FedAvg+FT), level with
    Local."""
    if label in ("FedAvg", "FedAvg+FT"):
        return (60.0 if eps is None else 30.0 + eps) + seed
    return 55.0 + seed / 3 + (0.1 * seed if label != LOCAL else 0.0)


@pytest.mark.parametrize("accuracy, drop_verdict, level_verdict, claim_verdict", [
    (personalization_helps, HOLDS, HOLDS, REPRODUCED), (personalization_hurts, FAILS, FAILS, NOT_REPRODUCED),
    (local_in_disguise, HOLDS, NO_EFFECT, NO_EFFECT)])
def test_the_verdict_follows_the_drops_and_the_levels(tmp_path, accuracy, drop_verdict, level_verdict, claim_verdict):
    results = _evaluate(_runs(tmp_path, accuracy))
    assert results["runs_done"] == results["runs_total"] == RUN_COUNT * SEEDS
    for claim, method in zip(results["claims"], PERSONALIZED):
        drop, *levels = claim["tests"]
        drops = [(accuracy("FedAvg+FT", None, s) - accuracy("FedAvg+FT", TESTED, s))
                 - (accuracy(method, None, s) - accuracy(method, TESTED, s)) for s in range(SEEDS)]
        assert drop["values"] == pytest.approx(drops)  # paired by seed, in points
        assert drop["verdict"] == drop_verdict and all(t["verdict"] == level_verdict for t in levels)
        assert claim["verdict"] == claim_verdict
    if accuracy is personalization_helps:  # FedAvg at 11..18 points for epsilon 1..8, 40 without DP: noise matters
        assert results["claims"][-1]["verdict"] == REPRODUCED


def test_the_section_shows_each_arm_each_calibrated_z_the_clip_norms_source_and_the_tests(tmp_path):
    runs = _runs(tmp_path / "runs", personalization_helps)
    folders = folder_keys(run_trees(PAPER, "cpu"))
    results = _evaluate(runs)
    spent = privacy_of_runs(PAPER, "cpu", runs, folders, SEEDS)
    assert spent["1"]["noise_multiplier"] == [Z[1]] and spent["8"]["delta"] == [4e-6]  # once, not per run
    norms = proxy_norms(PAPER, "cpu", runs, folders, SEEDS)
    assert norms == pytest.approx([0.95, 0.96, 0.97])  # each seed's median over its rounds
    clipped = clipped_share(PAPER, "cpu", runs, folders, SEEDS)
    assert clipped == pytest.approx(0.4)
    config = _dp_config(runs)
    page = tmp_path / "docs" / "privacy.md"
    page.parent.mkdir()
    page.write_text("# Privacy\n\n## User-level DP: what is clipped and noised\n\nTheirs.\n")
    written = write(results, spent, config, page, tmp_path / "docs" / "images", norms, clipped)
    text = page.read_text()
    assert written == [tmp_path / "docs" / "images" / FIGURE, page] and written[0].stat().st_size > 0
    assert text.startswith("# Privacy\n\n## User-level DP: what is clipped and noised\n\nTheirs.\n")  # kept
    # FedAvg at epsilon 1 over seeds 0..2: 11, 12, 13 -> 12.0 [9.5, 14.5]; FedPer at inf: 65, 65.5, 66 -> 65.5.
    assert "| FedAvg (initial) | 12.0 [9.5, 14.5] |" in text and "| 65.5 [64.3, 66.7] |" in text
    assert "| FedAvg+FT (personalized) | 32.0 [29.5, 34.5] |" in text and "| FedBABU (personalized) |" in text
    assert f"| {LOCAL} (initial; shares nothing, no DP needed) | " + " | ".join(["55.3 [54.5, 56.2]"] * 5) in text
    assert "| noise multiplier z (calibrated) | 1.93 | 1.27 | 0.89 | 0.65 | no noise |" in text
    assert "δ = 4e-06 (min(1e-5, 1/N²); N × δ = 0.002)" in text and "500 clients" in text
    assert "C = 0.9 was chosen before the runs from a proxy population" in text
    assert "0.950, 0.960, 0.970 (seeds 0..2)" in text and "it shortened 40% of the updates" in text
    assert text.count("**holds**") == 3 * 5 + 1 and "(a check of the setting, outside the tally)" in text
    assert f"![accuracy against epsilon per method](images/{FIGURE})" in text
    # Again: the section is replaced between its markers, not appended.
    write(results, spent, config, page, tmp_path / "docs" / "images", norms, clipped)
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
    text = section(results, {}, config, "", [])
    assert f"0 of {RUN_COUNT * SEEDS} runs finished" in text and "![" not in text
    assert text.count("| - | - | - | - | - |") == len(METHODS) + 1  # every method's row empty, Local's too
    assert "update norm: not run yet" in text
    stale = tmp_path / "images" / FIGURE
    stale.parent.mkdir()
    stale.write_bytes(b"drawn from runs that are gone")
    write(results, {}, config, tmp_path / "privacy.md", stale.parent, [])
    assert not stale.exists()


def test_the_dry_run_counts_every_run_and_starts_none(tmp_path, data_root, capsys):
    assert main(["reproduce", "privacy", "--dry-run", "--runs", str(tmp_path / "runs"), "--kept",
                 str(tmp_path / "kept"), f"data.root={data_root}"]) == 0
    out = capsys.readouterr().out
    statuses = [line for line in out.splitlines() if line.endswith(": new")]
    assert len(statuses) == RUN_COUNT * SEEDS and f"all {RUN_COUNT * SEEDS} runs:" in out
    assert out.count("privacy-cpu-") == RUN_COUNT + RUN_COUNT * SEEDS  # seed 0's estimates, then every run's status
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_unknown_claim_is_one_line_exit_2(tmp_path, capsys):
    assert main(["reproduce", "privacy", "--only", "fedrep", "--dry-run", "--runs", str(tmp_path),
                 "--kept", str(tmp_path / "kept")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--only" in err and "ditto" in err
