"""Issue 28 item 3, the claims at the papers' own settings: FedBABU App. F (CIFAR-10, 4convNet, 100 clients),
Sec. 4 (global vs personalized), App. D (momentum), App. M (FedProx+BABU) and FedPer's convergence speed (a point
on each run's curve). Their runs plan and validate at both scales, their seeds are fixed, and every test can both
hold and fail on made-up per-seed values."""
import json
from pathlib import Path

import pytest

from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import MARGIN
from fedsim.reproduce.verdicts import FAILS, HOLDS, _test_result, evaluate_claim
from fedsim.reproduce.runner import client_values_at, folder_keys, plan, run_name, run_trees

NEW = {"fedbabu": ("appf-cifar10", "global-vs-personal", "momentum", "fedprox-babu"), "fedper": ("convergence",)}
CLAIMS = [(paper, claim_id) for paper, ids in NEW.items() for claim_id in ids]
SEEDS = 5


@pytest.mark.parametrize("paper, claim_id", CLAIMS)
@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_each_new_claims_runs_plan_and_validate_at_its_fixed_seeds(paper, claim_id, scale, tmp_path):
    claim = PAPERS[paper].claim(claim_id)
    assert claim.seeds == SEEDS and claim.counts
    planned = plan(PAPERS[paper], (claim,), scale, claim.seeds, tmp_path)  # validates every config
    folders = folder_keys(run_trees(PAPERS[paper], scale))
    assert {p.key for p in planned} == {folders[arm.run] for arm in claim.arms}
    assert sorted({p.seed for p in planned}) == list(range(SEEDS))


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_app_f_is_the_papers_own_setting_at_both_scales(scale, tmp_path):
    """CIFAR-10, the 4convNet, 100 clients of 500 images with 2 single-class shards, f = 0.1, tau = 4, 320 epochs."""
    claim = PAPERS["fedbabu"].claim("appf-cifar10")
    for item in plan(PAPERS["fedbabu"], (claim,), scale, 1, tmp_path):
        cfg = item.config
        assert (cfg.data.dataset, cfg.data.num_clients, cfg.data.train_fraction, cfg.model.name) == \
            ("cifar10", 100, 1.0, "cnn4")
        assert (cfg.data.partition.name, cfg.data.partition.shards_per_client) == ("shards", 2)
        assert (cfg.train.fraction, cfg.train.local_epochs, cfg.train.rounds) == (0.1, 4, 80)
        assert cfg.train.rounds * cfg.train.local_epochs == 320
    algorithms = {item.key: item.config.algorithm.name for item in plan(PAPERS["fedbabu"], (claim,), scale, 1, tmp_path)}
    assert algorithms == {"appf-fedavg": "fedavg", "appf-fedbabu": "fedbabu"}


def test_momentum_and_fedprox_runs_set_what_their_appendix_varies(tmp_path):
    paper = PAPERS["fedbabu"]
    runs = {p.key: p.config for p in plan(paper, (paper.claim("momentum"), paper.claim("fedprox-babu")), "cpu", 1,
                                          tmp_path)}
    for key, m in (("fedavg-tau10", 0.9), ("fedavg-tau10-m0", 0.0), ("fedavg-tau10-m0.99", 0.99),
                   ("fedbabu-tau10", 0.9), ("fedbabu-tau10-m0", 0.0)):
        cfg = runs[key]
        assert cfg.train.body.momentum == cfg.train.head.momentum == m and cfg.train.local_epochs == 10, key
        assert cfg.eval.finetune_momentum == 0.9  # only training differs
    prox = runs["fedprox_babu-f1"]
    assert (prox.algorithm.name, prox.algorithm.mu, prox.train.fraction) == ("fedprox_babu", 0.01, 1.0)
    assert runs["fedbabu-f1"].train.fraction == runs["fedavg-f1"].train.fraction == 1.0


def _arms_for(test, contrast: float, noise=(0.0, 0.4, -0.4, 0.8, -0.8)) -> dict:
    """Per-seed arm values (SEEDS seeds) whose paired contrast is ``contrast`` + a little seed noise: every arm at
    50 points, the first term's arm moved so that sum(coef x arm) comes out as wanted."""
    label, coef = test.terms[0]
    arms = {name: [50.0] * SEEDS for name, _ in test.terms}
    rest = sum(c * 50.0 for name, c in test.terms[1:] if name != label)
    same = sum(c for name, c in test.terms if name == label)
    arms[label] = [(contrast + n - rest) / same for n in noise]
    return {name: {"seeds": list(range(SEEDS)), "per_seed_mean": v, "per_seed_std": v} for name, v in arms.items()}


@pytest.mark.parametrize("paper, claim_id", CLAIMS)
def test_every_test_of_each_new_claim_can_hold_and_can_fail(paper, claim_id):
    """A clear effect holds; a null (contrast 0, below threshold + margin) fails: the claim can come out not
    reproduced."""
    claim = PAPERS[paper].claim(claim_id)
    assert claim.tests
    for test in claim.tests:
        assert test.margin == MARGIN and test.above == 0.0
        held = _test_result(test, _arms_for(test, 10.0), claim.seeds)
        null = _test_result(test, _arms_for(test, 0.0), claim.seeds)
        reversed_ = _test_result(test, _arms_for(test, -5.0), claim.seeds)
        assert (held["verdict"], null["verdict"], reversed_["verdict"]) == (HOLDS, FAILS, FAILS), test.text
        assert held["values"] == pytest.approx([10.0 + n for n in (0.0, 0.4, -0.4, 0.8, -0.8)])
        assert "fails if" in test.fails_if()


def test_global_vs_personal_holds_when_only_the_initial_falls_and_fails_when_both_fall_alike():
    claim = PAPERS["fedbabu"].claim("global-vs-personal")
    [tau, _] = claim.tests

    def arms(init1, init10, pers1, pers10):
        values = {"initial tau=1": init1, "initial tau=10": init10, "personalized tau=1": pers1,
                  "personalized tau=10": pers10}
        return {k: {"seeds": list(range(SEEDS)), "per_seed_mean": [v + 0.3 * s for s in range(SEEDS)]}
                for k, v in values.items()}

    assert _test_result(tau, arms(40, 30, 60, 61), SEEDS)["verdict"] == HOLDS  # initial −10, personalized +1
    assert _test_result(tau, arms(40, 30, 60, 50), SEEDS)["verdict"] == FAILS  # both −10: follows the global


def _run_folder(root: Path, name: str, curve: dict[int, list[float]], finished: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    rows = [{"round": r, "client": c, "acc": acc} for r, accs in curve.items() for c, acc in enumerate(accs)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if finished:
        last = max(curve)
        (folder / "summary.json").write_text(json.dumps({
            "rounds": last, "acc": {}, "per_client_acc": {str(c): a for c, a in enumerate(curve[last])}}))
    return folder


def test_a_curve_arm_reads_its_round_or_its_fraction_of_the_rounds(tmp_path):
    curve = {r: [r / 20, r / 10] for r in range(1, 11)}
    folder = _run_folder(tmp_path, "run", curve)
    assert client_values_at(folder, "acc", 3) == [0.15, 0.3]
    assert client_values_at(folder, "acc", 0.5) == client_values_at(folder, "acc", 5) == [0.25, 0.5]
    assert client_values_at(_run_folder(tmp_path, "running", curve, finished=False), "acc", 5) is None
    with pytest.raises(ValueError, match="round 12"):
        client_values_at(folder, "acc", 12)


@pytest.mark.parametrize("fedper_halfway, verdicts", [
    (0.80, [HOLDS, HOLDS]),  # at 80% halfway and flat after; FedAvg climbs 40 -> 60
    (0.50, [FAILS, FAILS]),  # FedPer climbs like FedAvg (50 -> 70), below FedAvg's final halfway
])
def test_the_convergence_claim_is_read_from_the_runs_curves(tmp_path, fedper_halfway, verdicts):
    """evaluate_claim reads FedPer's and FedAvg's halfway rounds from metrics.jsonl and their final rounds from
    summary.json; a FedPer that only converges as fast as FedAvg fails both tests."""
    paper = PAPERS["fedper"]
    claim = paper.claim("convergence")
    folders = folder_keys(run_trees(paper, "cpu"))
    for seed in range(SEEDS):
        jitter = 0.005 * seed
        fedavg = {5: [0.40 + jitter] * 2, 10: [0.60 + jitter] * 2}
        late = 0.82 if fedper_halfway > 0.6 else 0.70
        fedper = {5: [fedper_halfway + jitter] * 2, 10: [late + jitter] * 2}
        _run_folder(tmp_path, run_name(paper, "cpu", folders["k4-fedavg"], seed), fedavg)
        _run_folder(tmp_path, run_name(paper, "cpu", folders["k4-fedper"], seed), fedper)
    result = evaluate_claim(claim, paper, "cpu", tmp_path, folders)
    halfway = next(a for a in result["arms"] if a["label"] == "FedPer, halfway")
    assert halfway["per_seed_mean"] == pytest.approx([100 * (fedper_halfway + 0.005 * s) for s in range(SEEDS)])
    assert [t["verdict"] for t in result["tests"]] == verdicts
