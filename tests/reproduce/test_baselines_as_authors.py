"""Issue 28 item 1, the remaining baselines as their authors run them (planning and config checks, no runs):
FedRep personalized by a rerun of its own update (the FedBABU authors' main_fedrep.py / LocalUpdateFedRep,
momentum 0.5 from utils/options.py since run_fedrep.sh passes none); FedPer decided at the paper's plain SGD, its CPU
momentum 0.9 runs shown as context (issue 48); FedBABU's method comparisons at both momentum settings; FedBABU's
fixed head at nn.Linear's default row norm
(`head_init: orthogonal_scaled`) wherever FedBABU meets a default-initialised baseline, unit rows only in the
orthogonal-head claim's tested pair."""
import pytest

from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import AS_DECLARED, Arm, Claim, Paper, Setting
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

def test_fedper_cpu_optimizers_are_stated_in_every_claim_with_the_batchnorm_averaging(tmp_path):
    runs = _configs(PER, ("k4",), "cpu", tmp_path)
    assert (runs["k4-fedper"].train.body.momentum, runs["k4-fedper-sgd"].train.body.momentum) == (0.9, 0.0)
    base = runs["k4-fedper-sgd"]
    assert (base.train.batch_size, base.model.batchnorm) == (50, None)  # None: averaged
    for claim in PER.claims:
        assert "momentum 0.9" in claim.regime and "plain SGD" in claim.regime, claim.id
        assert "BatchNorm's running statistics" in claim.regime and "averaged" in claim.regime, claim.id
    assert "momentum 0.9" in PER.scale_notes["cpu"]


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_fedper_claim_is_decided_at_the_papers_plain_sgd(scale, tmp_path):
    """Issue 48 item 1: every counted run of every FedPer claim has momentum 0 (Algorithm 1, lr 0.01); at the CPU
    scale the base's momentum 0.9 runs are shown beside it as untested context, and differ in the momentum only."""
    trees, folders = run_trees(PER, scale), folder_keys(run_trees(PER, scale))
    for claim in PER.claims:
        settings = PER.settings_of(claim, scale)
        counted = [s for s in settings if s.counts]
        assert len(counted) == 1, claim.id
        for arm in claim.arms:
            tree = trees[folders[arm.run + counted[0].suffix]]
            assert tree["train"]["body"]["momentum"] == tree["train"]["head"]["momentum"] == 0.0, (claim.id, arm.run)
            assert tree["train"]["body"]["lr"] == 0.01, (claim.id, arm.run)
            for context in (s for s in settings if not s.counts):
                other = trees[arm.run + context.suffix]
                momentum = {part: {**other["train"][part], "momentum": 0.0} for part in ("body", "head")}
                assert {**other, "train": {**other["train"], **momentum}} == tree, (claim.id, arm.run)
    if scale == "paper":  # plain SGD is the paper scale's base: read as declared, nothing else
        assert all(PER.settings_of(c, scale) == (AS_DECLARED,) for c in PER.claims)


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
        assert runs[folder].algorithm.params.get("head_init") == \
            UNIT.get(key.removesuffix("-m0"), "orthogonal_scaled"), key


def test_the_orthogonal_head_claim_tests_unit_rows_and_shows_the_scaled_head_untested():
    claim = BABU.claim("orthogonal-head")
    tested = {claim.arm(label).run for test in claim.tests for label, _ in test.terms}
    assert tested == {"fedbabu-unit", "fedbabu-nonorthogonal"}
    assert "fedbabu" in {arm.run for arm in claim.arms} - tested
    for claim_id in ("fedbabu-best", "finetune-part", "dirichlet", "appf-cifar10", "momentum", "fedprox-babu"):
        assert "orthogonal_scaled" in BABU.claim(claim_id).regime, claim_id


# -- FedBABU's optimizer ------------------------------------------------------------------------------------------

COMPARE_METHODS = ("fedbabu-best", "finetune-part", "orthogonal-head", "dirichlet", "fedprox-babu")


def test_fedbabus_method_comparisons_are_decided_at_both_momentum_settings(tmp_path):
    """Issue 48 item 1: at the CPU scale each claim comparing methods counts momentum 0.9 (the authors') and plain SGD
    alike, with only the local optimizer's momentum changed (the evaluation's fine-tuning keeps 0.9, as App. D);
    App. F, App. D and the claims that vary FedAvg's setting alone are read as declared."""
    for claim in BABU.claims:
        settings = BABU.settings_of(claim, "cpu")
        if claim.id in COMPARE_METHODS:
            assert [(s.suffix, s.counts) for s in settings] == [("", True), ("-m0", True)], claim.id
        else:
            assert settings == (AS_DECLARED,), claim.id
    runs = _configs(BABU, COMPARE_METHODS, "cpu", tmp_path)
    for key in ("fedavg", "fedbabu", "fedper", "fedrep", "lg_fedavg", "dir0.1-fedbabu", "fedprox_babu-f1"):
        plain, authors = runs[f"{key}-m0"], runs[key]
        assert plain.train.body.momentum == plain.train.head.momentum == 0.0, key
        assert plain.eval.finetune_momentum == authors.eval.finetune_momentum, key
        same_start = plain.model.model_copy(update={"init_from": authors.model.init_from})  # its own setting's FedAvg
        assert plain.model_copy(update={"train": authors.train, "name": authors.name, "model": same_start}) == authors
    # LG-FedAvg starts from FedAvg's model at the same setting
    assert runs["lg_fedavg-m0"].model.init_from.endswith("fedbabu-cpu-fedavg-m0-s0")
    assert all(BABU.settings_of(c, "paper") == (AS_DECLARED,) for c in BABU.claims)


@pytest.mark.parametrize("paper", [BABU, PER])
def test_every_arm_names_a_run_of_its_paper(paper):
    assert all(arm.run in paper.runs for claim in paper.claims for arm in claim.arms)


@pytest.mark.parametrize("paper, scale, folders, runs", [(PER, "cpu", 38, 190), (PER, "paper", 19, 95),
                                                         (BABU, "cpu", 57, 279), (BABU, "paper", 37, 179)])
def test_the_suites_plan_counts_each_settings_runs_once(paper, scale, folders, runs, tmp_path):
    """What `--dry-run` lists: at the CPU scale FedPer's 19 run folders at plain SGD and at momentum 0.9 (K_P = 1 is
    the base run), FedBABU's 37 as declared plus the 20 plain-SGD runs of its method comparisons; at paper scale
    the runs as declared; 5 seeds each, but App. F under Flower's lr (2 runs), a check at 2 seeds."""
    planned = plan(paper, paper.claims, scale, None, tmp_path)
    assert len({p.key for p in planned}) == folders and len(planned) == runs


def test_a_setting_never_reuses_a_declared_runs_name():
    claim = Claim("c", "c", "-", (Arm("A", "a"),), (), "-")
    with pytest.raises(ValueError, match="'a-m0' is declared and also a run at a setting"):
        Paper("toy", "toy", PER.bases, {"a": {}, "a-m0": {"data.k": 8}}, (claim,),
              settings={"cpu": (Setting("", "as declared"), Setting("-m0", "plain SGD", {"train.body.momentum": 0.0}))})
