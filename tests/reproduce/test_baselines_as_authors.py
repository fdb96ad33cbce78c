"""Issue 28 item 1, the remaining baselines as their authors run them (planning and config checks, no runs):
FedRep personalized by a rerun of its own update (the FedBABU authors' main_fedrep.py / LocalUpdateFedRep,
momentum 0.5 from utils/options.py since run_fedrep.sh passes none); FedPer's CPU optimizer deviation stated in
every claim and measured by a plain-SGD pair; FedBABU's fixed head at nn.Linear's default row norm
(`head_init: orthogonal_scaled`) wherever FedBABU meets a default-initialised baseline, unit rows only in the
orthogonal-head claim's tested pair."""
import pytest

from fedsim.reproduce import PAPERS
from fedsim.reproduce.runner import folder_keys, plan, run_trees

BABU, PER = PAPERS["fedbabu"], PAPERS["fedper"]


def _configs(paper, claim_ids, scale, tmp_path):
    claims = tuple(paper.claim(c) for c in claim_ids)
    return {item.key: item.config for item in plan(paper, claims, scale, 1, tmp_path)}


# -- FedRep ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_fedrep_is_personalized_by_its_own_update_at_momentum_0_5(scale, tmp_path):
    runs = _configs(BABU, ("fedbabu-best",), scale, tmp_path)
    rep, avg = runs["fedrep"], runs["fedavg"]
    assert (rep.algorithm.name, rep.algorithm.params["head_epochs"], rep.algorithm.params["body_epochs"]) == ("fedrep", 4, 1)
    assert rep.algorithm.params["head_epochs"] == rep.train.local_epochs  # LocalUpdateFedRep: local_ep head epochs
    assert rep.train.body.momentum == rep.train.head.momentum == 0.5  # --momentum default, run_fedrep.sh sets none
    # main_fedrep.py's evaluation reruns LocalUpdateFedRep (tau head epochs, one body epoch) at the round's lr,
    # batch 50, no weight decay: FedRep's own client hook at its training settings.
    assert rep.eval.personalize == "own_update"
    assert (rep.train.batch_size, rep.train.body.weight_decay, rep.train.head.weight_decay) == (50, 0.0, 0.0)
    # Everything else as the suite's FedAvg: the same lr, schedule, batch and data.
    assert (rep.train.body.lr, rep.train.body.schedule, rep.train.batch_size, rep.train.rounds) == \
        (avg.train.body.lr, avg.train.body.schedule, avg.train.batch_size, avg.train.rounds)
    # The other baselines keep the generic 5-epoch full fine-tune at momentum 0.9.
    for key in ("fedavg", "fedper", "fedbabu"):
        assert (runs[key].eval.personalize, runs[key].eval.finetune_part, runs[key].eval.finetune_epochs,
                runs[key].eval.finetune_momentum) == ("finetune", "full", 5, 0.9), key


def test_fedbabu_best_states_fedreps_protocol_and_its_residual_difference():
    regime = BABU.claim("fedbabu-best").regime
    assert "main_fedrep.py" in regime and "momentum 0.5" in regime and "own_update" in regime
    # What still differs: the authors' one optimizer carries the head epochs' momentum into the body epoch.
    assert "Residual" in regime and "one optimizer" in regime


# -- FedPer ------------------------------------------------------------------------------------------------------

def test_fedper_cpu_base_keeps_momentum_and_every_claim_states_it_and_the_batchnorm_averaging(tmp_path):
    base = _configs(PER, ("k4",), "cpu", tmp_path)["k4-fedper"]
    assert (base.train.body.momentum, base.train.batch_size, base.model.batchnorm) == (0.9, 50, None)  # None: averaged
    for claim in PER.claims:
        assert "momentum 0.9" in claim.regime and "plain SGD" in claim.regime, claim.id
        assert "BatchNorm's running statistics" in claim.regime and "averaged" in claim.regime, claim.id
    assert "momentum 0.9" in PER.scale_notes["cpu"]


def test_claim_k4_shows_the_papers_plain_sgd_as_untested_rows(tmp_path):
    k4 = PER.claim("k4")
    tested = {label for test in k4.tests for label, _ in test.terms}
    assert tested == {"FedAvg", "FedPer"}
    assert {k4.arm("FedAvg, plain SGD").run, k4.arm("FedPer, plain SGD").run} == {"k4-fedavg-sgd", "k4-fedper-sgd"}
    trees = run_trees(PER, "cpu")
    for sgd, base in (("k4-fedavg-sgd", "k4-fedavg"), ("k4-fedper-sgd", "k4-fedper")):
        assert trees[sgd]["train"]["body"]["momentum"] == trees[sgd]["train"]["head"]["momentum"] == 0.0
        # only the momentum differs from the tested run
        changed = {part: {**trees[sgd]["train"][part], "momentum": 0.9} for part in ("body", "head")}
        assert {**trees[sgd], "train": {**trees[sgd]["train"], **changed}} == trees[base], sgd
    # The paper scale already runs plain SGD: the pair are the tested runs there (one folder each).
    paper = folder_keys(run_trees(PER, "paper"))
    assert (paper["k4-fedavg-sgd"], paper["k4-fedper-sgd"]) == ("k4-fedavg", "k4-fedper")


# -- FedBABU's head ----------------------------------------------------------------------------------------------

UNIT = {"fedbabu-unit": "orthogonal", "fedbabu-nonorthogonal": "not_orthogonal"}


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_fedbabu_run_has_the_default_inits_row_norm_but_the_unit_norm_pair(scale, tmp_path):
    runs = _configs(BABU, tuple(c.id for c in BABU.claims), scale, tmp_path)
    folders = folder_keys(run_trees(BABU, scale))
    babu = {key: folders[key] for key in BABU.runs if folders[key] in runs
            and runs[folders[key]].algorithm.name in ("fedbabu", "fedprox_babu")}
    assert "fedprox_babu-f1" in babu and "pfllib-fedbabu" in babu and set(UNIT) <= set(babu)
    for key, folder in babu.items():
        assert runs[folder].algorithm.params.get("head_init") == UNIT.get(key, "orthogonal_scaled"), key


def test_the_orthogonal_head_claim_tests_unit_rows_and_shows_the_scaled_head_untested():
    claim = BABU.claim("orthogonal-head")
    tested = {claim.arm(label).run for test in claim.tests for label, _ in test.terms}
    assert tested == {"fedbabu-unit", "fedbabu-nonorthogonal"}
    assert "fedbabu" in {arm.run for arm in claim.arms} - tested
    for claim_id in ("fedbabu-best", "finetune-part", "dirichlet", "appf-cifar10", "momentum", "fedprox-babu"):
        assert "orthogonal_scaled" in BABU.claim(claim_id).regime, claim_id


@pytest.mark.parametrize("paper", [BABU, PER])
def test_every_arm_names_a_run_of_its_paper(paper):
    assert all(arm.run in paper.runs for claim in paper.claims for arm in claim.arms)
