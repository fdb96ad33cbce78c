"""Issue 28 item 3, the claims at the papers' own settings: FedBABU App. F (CIFAR-10, 4convNet, 100 clients),
Sec. 4 (global vs personalized), App. D (momentum), App. M (FedProx+BABU) and FedPer's convergence speed (rounds
to 90% of each run's own final). Their runs plan and validate at both scales, their seeds are fixed, and every test can
hold, show no effect and fail on made-up per-seed values."""
import json
from pathlib import Path

import pytest

from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import MARGIN
from fedsim.reproduce.verdicts import FAILS, HOLDS, NO_EFFECT, _test_result, evaluate_claim, rounds_to
from fedsim.reproduce.runner import client_values_at, folder_keys, plan, run_name, run_trees

NEW = {"fedbabu": ("appf-cifar10", "global-vs-personal", "momentum", "fedprox-babu"), "fedper": ("convergence",)}
CLAIMS = [(paper, claim_id) for paper, ids in NEW.items() for claim_id in ids]
SEEDS = 5


@pytest.mark.parametrize("paper, claim_id", CLAIMS)
@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_each_new_claims_runs_plan_and_validate_at_its_fixed_seeds(paper, claim_id, scale, tmp_path):
    claim = PAPERS[paper].claim(claim_id)
    assert claim.seeds == SEEDS and claim.counts == (claim_id != "global-vs-personal")  # a reading of ours: outside
    planned = plan(PAPERS[paper], (claim,), scale, claim.seeds, tmp_path)  # validates every config
    folders = folder_keys(run_trees(PAPERS[paper], scale))
    settings = PAPERS[paper].settings_of(claim, scale)
    assert {p.key for p in planned} == {folders[arm.run + s.suffix] for s in settings for arm in claim.arms}
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
    """A clear effect holds; a null (contrast 0, below threshold + margin) is no effect ≥ margin; the opposite
    direction fails: the claim can come out not reproduced."""
    claim = PAPERS[paper].claim(claim_id)
    assert claim.tests
    for test in claim.tests:
        assert test.margin == (1.0 if test.unit == "rounds" else MARGIN)  # a speed's margin: one round and test.above == 0.0
        held = _test_result(test, _arms_for(test, 10.0), claim.seeds)
        null = _test_result(test, _arms_for(test, 0.0), claim.seeds)
        reversed_ = _test_result(test, _arms_for(test, -5.0), claim.seeds)
        assert (held["verdict"], null["verdict"], reversed_["verdict"]) == (HOLDS, NO_EFFECT, FAILS), test.text
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
    assert _test_result(tau, arms(40, 30, 60, 50), SEEDS)["verdict"] == NO_EFFECT  # both −10: follows the global
    assert _test_result(tau, arms(40, 30, 60, 40), SEEDS)["verdict"] == FAILS  # personalized falls more


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


def test_rounds_to_a_fraction_of_its_own_final_reads_speed_apart_from_level():
    assert rounds_to({1: 0.2, 2: 0.5, 3: 0.55, 4: 0.6}, 0.9) == 3  # 90% of 0.6 = 0.54
    assert rounds_to({1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}, 0.9) == 4  # still climbing: only the final reaches it
    assert rounds_to({1: 0.3, 2: 0.7, 3: 0.5}, 0.9) == 2  # a zigzag: the first round at 90% of the final counts


def _curve(level: float, converged_at: int, rounds: int = 10) -> dict[int, float]:
    """A curve that climbs linearly to ``level`` at ``converged_at`` and stays there."""
    return {r: level * min(1.0, r / converged_at) for r in range(1, rounds + 1)}


@pytest.mark.parametrize("fedper_at, fedavg_at, verdict", [
    ((3, 3, 4, 3, 4), (8, 7, 8, 9, 8), HOLDS),  # FedPer flattens 4-5 rounds earlier in every seed
    ((8, 7, 8, 9, 8), (3, 3, 4, 3, 4), FAILS),  # FedAvg converges first: the opposite
    ((5, 5, 6, 5, 5), (5, 6, 5, 5, 5), NO_EFFECT),  # the same speed: no difference of a round or more
])
def test_the_convergence_claim_is_read_from_each_runs_own_curve(tmp_path, fedper_at, fedavg_at, verdict):
    """evaluate_claim reads each run's rounds to 90% of its own final from metrics.jsonl; FedPer's higher level
    (80 against 50) never makes it faster by itself: a FedPer that converges later fails."""
    paper = PAPERS["fedper"]
    claim = paper.claim("convergence")
    folders = folder_keys(run_trees(paper, "cpu"))
    for setting in paper.settings_of(claim, "cpu"):
        for seed in range(SEEDS):
            for key, level, at in (("k4-fedavg", 0.5, fedavg_at[seed]), ("k4-fedper", 0.8, fedper_at[seed])):
                curve = {r: [v, v] for r, v in _curve(level, at).items()}
                _run_folder(tmp_path, run_name(paper, "cpu", folders[key + setting.suffix], seed), curve)
    result = evaluate_claim(claim, paper, "cpu", tmp_path, folders)
    counted = [t for t in result["tests"] if t["counts"]]
    assert [t["verdict"] for t in counted] == [verdict]
    fedper = next(a for a in result["arms"] if a["label"].startswith("FedPer, rounds to 90%") and
                  a["setting"] == counted[0]["setting"])
    # 90% of the final is first reached at 0.9 x converged_at, rounded up
    assert fedper["per_seed_mean"] == [float(-(-9 * at // 10)) for at in fedper_at]
