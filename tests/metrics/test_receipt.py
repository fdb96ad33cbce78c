"""fedsim/metrics/receipt.py: an arm's receipt from its runs' stored configs, and the settings arms differ in."""
from fedsim.config import validate
from fedsim.metrics.receipt import differences, receipt


def _config(**over) -> dict:
    return validate({"algorithm": "fedavg", "train": {"rounds": 3}, **over}).model_dump()


def test_a_receipt_says_how_the_arm_trained_what_it_scored_how_its_round_was_picked_and_its_seeds():
    seeds = [_config(seed=s, data={"validation": 0.2}, eval={"personalize": "own_update"})
             for s in (2, 0)]
    r = receipt(seeds, ["acc_personalized"], at="round 2")
    assert (r["optimizer"], r["lr"], r["momentum"], r["rounds"]) == ("sgd", "0.01", "0.9", "3")
    assert r["scored"] == "personalized: the method's own client update"
    assert r["round"] == "round 2; best round on validation" and r["seeds"] == "0, 2"
    stepped = receipt([_config(train={"rounds": 3, "body": {"schedule": "step"}})], ["acc"])
    assert stepped["lr"] == "0.01, constant/step schedule" and "not a selection" in stepped["round"]


def test_a_receipt_given_the_optimizers_a_run_set_up_prints_those_not_the_configs_unused_values():
    """Issue 67 item 1: a module with its own Adam at 0.01 ran under a config saying sgd, lr 0.00162271."""
    config = _config(train={"rounds": 3, "body": {"lr": 0.00162271, "schedule": "step"},
                            "head": {"lr": 0.00162271}})
    adam = ["body: Adam (optimizer 0, group 0, 4 tensors): lr 0.01, betas (0.9, 0.999), eps 1e-08, weight_decay 0",
            "head: Adam (optimizer 0, group 0, 2 tensors): lr 0.01, betas (0.9, 0.999), eps 1e-08, weight_decay 0"]
    r = receipt([config], ["acc"], optimizers=adam)
    assert (r["optimizer"], r["lr"], r["momentum"]) == ("Adam", "0.01, constant/step schedule", "betas (0.9, 0.999)")
    groups = ["body: SGD (optimizer 0, group 0, 4 tensors): lr 0.05, momentum 0.9, weight_decay 0, nesterov False",
              "head: SGD (optimizer 0, group 1, 2 tensors): lr 0.005, momentum 0.9, weight_decay 0, nesterov False"]
    assert receipt([config], ["acc"], optimizers=groups)["lr"] == "body 0.05 / head 0.005, constant/step schedule"


def test_a_receipt_prints_no_value_of_a_setting_the_method_never_reads():
    config = {"seed": 0, "algorithm": {"name": "perfedavg"}, "train": {"rounds": 2, "body": {"momentum": 0.9},
                                                                      "head": {"momentum": 0.9}}}
    assert receipt([config], ["acc"])["momentum"] == "not used by the method"
    assert receipt([{**config, "algorithm": {"name": "fedavg"}}], ["acc"])["momentum"] == "0.9"


def test_arms_differ_in_the_settings_that_change_results_never_in_their_seed_or_name():
    a, b = _config(seed=0, name="a"), _config(seed=1, name="b", train={"rounds": 3, "body": {"momentum": 0.0}})
    assert differences([a, b]) == ["train.body.momentum"] and differences([a, a]) == []


def test_a_setting_an_older_runs_config_predates_reads_as_its_legacy_default_not_as_a_difference():
    new, old = _config(seed=0), _config(seed=1)
    del old["data"]["validation"], old["system"]["server_momentum"], old["eval"]["personalize"]
    assert differences([new, old]) == []  # the older run ran at the defaults the newer one states
    held_out = _config(seed=0, data={"validation": 0.2})
    assert differences([held_out, old]) == ["data.validation"]  # a real difference is still named


def test_a_method_parameter_an_older_runs_config_predates_reads_as_the_methods_default():
    """FedBABU's finetune_from came after App. F's first runs: their config.yaml lacks it and they ran at its
    default (global), which a later arm's config states."""
    new, old = _config(algorithm={"name": "fedbabu"}), _config(algorithm={"name": "fedbabu"})
    assert new["algorithm"]["finetune_from"] == "global"
    del old["algorithm"]["finetune_from"]
    assert differences([new, old]) == []
    # Nor does its receipt: both rows name the parameter at the value each ran with.
    assert receipt([old], ["acc"])["method"] == receipt([new], ["acc"])["method"]
    assert "finetune_from global" in receipt([old], ["acc"])["method"]
    own = _config(algorithm={"name": "fedbabu", "finetune_from": "own_update"})
    assert differences([own, old]) == ["algorithm.finetune_from"]  # a real difference is still named
    # Compared between the arms whose method has it: FedAvg has no finetune_from, it differs in algorithm.name.
    assert differences([own, _config()]) == ["algorithm.name"]
    assert differences([own, old, _config()]) == ["algorithm.finetune_from", "algorithm.name"]
    # A plug-in method named by a run folder is never imported to read it: its parameters compared as written.
    plugin = {**old, "algorithm": {"name": "no_such_package.module:Method"}}
    assert differences([plugin, {**plugin, "algorithm": {**plugin["algorithm"], "mu": 1}}]) == ["algorithm.mu"]
    assert receipt([{**plugin, "algorithm": {**plugin["algorithm"], "mu": 1}}], ["acc"])["method"] == (
        "no_such_package.module:Method (mu 1)")
