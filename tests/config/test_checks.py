"""fedsim/config/checks.py: every rule that ties two sections together, refused by ``validate`` with its one line
before any data loads (so ``--dry-run`` refuses it too)."""
import re

import pytest

from conftest import write_yaml

from fedsim.cli.main import main
from fedsim.config import check_sections, validate
from fedsim.errors import ConfigError

CLOCK = {"devices": {"preset": "uniform"}}
ASYNC = {**CLOCK, "mode": "async"}


@pytest.mark.parametrize("tree, message", [
    ({"algorithm": "fedfomo", "server": {"aggregator": "median"}},
     "server.aggregator: fedfomo combines its clients' replies itself; robust rules replace the mean of the FedAvg "
     "family's methods; leave server.aggregator: mean"),
    ({"logging": {"wandb": {"x_axis": "sim_time"}}},
     "logging.wandb.x_axis: sim_time needs the virtual clock; set system.devices (e.g. system.devices.preset=uniform) "
     "or x_axis=round"),
    ({"model": {"precision": "16-mixed"}},
     "model.precision: 16-mixed needs a GPU (engine.gpus_per_worker > 0); use bf16-mixed on a CPU"),
    ({"algorithm": "fedavg", "system": ASYNC, "server": {"aggregator": "median"}},
     "server.aggregator: median needs the round's replies together; FedBuff's steps (system.mode=async) take the "
     "mean; use mode sync or aggregator mean"),
    ({"algorithm": "fedrod", "model": {"client": "user_plugins:TwoPartModule"}},
     "algorithm.name: fedrod trains with its own objective (balanced softmax and a personal head) on the network's "
     "forward, which would bypass model.client user_plugins:TwoPartModule's training_step; use the built-in client "
     "(unset model.client) or a method that trains through the module"),
    ({"tune": {"methods": ["fedavg"]}},
     "data.validation: fedsim tune chooses each method's settings on the validation split, and this config has none; "
     "set data.validation (e.g. 0.1)"),
    ({"train": {"sampling": "poisson"}, "system": CLOCK},
     "train.sampling: poisson draws who takes part, and the virtual clock (system.devices) picks participants "
     "itself; set train.sampling: fixed or remove system.devices"),
    ({"algorithm": "fedavg", "privacy": {"noise_multiplier": 1.0}, "system": CLOCK, "train": {"weighting": "uniform"}},
     "privacy.dp: the virtual clock (system.devices) decides who takes part by availability, deadlines and dropouts, "
     "which no accountant's sampling describes, so epsilon could not be stated; remove system.devices, or set "
     "privacy.dp: none"),
    ({"algorithm": "fedavg", "privacy": {"noise_multiplier": 1.0, "accountant": "pld"}, "train": {"weighting": "uniform"}},
     "privacy.accountant: pld has no accounting for fixed-size sampling without replacement (dp-accounting's PLD "
     "accountant lacks that event); set train.sampling: poisson or privacy.accountant: rdp"),
    ({"tune": {"methods": ["fedavg"]}, "data": {"validation": 0.1}, "sweep": {"seed": [1]}},
     "sweep: fedsim tune draws its own runs from tune (methods, trials, seeds, space); remove the sweep section, or "
     "run `fedsim sweep` on a copy without tune"),
])
def test_each_cross_section_rule_is_refused_with_its_line(tree, message):
    with pytest.raises(ConfigError) as err:
        validate(tree)
    assert str(err.value) == message


def test_async_names_the_methods_that_take_fedbuffs_step():
    with pytest.raises(ConfigError, match=r"^system.mode: async applies FedBuff's step to the weights alone; "
                       r"scaffold also sends or keeps server state") as err:
        validate({"algorithm": "scaffold", "system": ASYNC})
    listed = re.search(r"FedAvg family \(([^)]*)\)", str(err.value)).group(1).split(", ")
    assert "fedavg" in listed and "scaffold" not in listed and listed == sorted(listed)
    for method in ("fedavg", "fedper"):
        assert validate({"algorithm": method, "system": ASYNC}).system.mode == "async"


def test_the_same_settings_pass_where_the_other_section_agrees():
    validate({"algorithm": "fedavg", "server": {"aggregator": "median"}})
    validate({"logging": {"wandb": {"x_axis": "sim_time"}}, "system": CLOCK})
    validate({"model": {"precision": "16-mixed"}, "engine": {"gpus_per_worker": 0.5}})
    validate({"algorithm": "fedavg", "model": {"client": "user_plugins:TwoPartModule"}})
    validate({"tune": {"methods": ["fedavg"]}, "data": {"validation": 0.1}})
    validate({"train": {"sampling": "poisson"}})
    validate({"algorithm": "fedavg", "privacy": {"dp": "none", "secure_aggregation": True}, "system": CLOCK})
    validate({"algorithm": "fedavg", "privacy": {"noise_multiplier": 1.0, "accountant": "pld"},
              "train": {"sampling": "poisson", "weighting": "uniform"}})
    validate({"algorithm": "fedavg", "privacy": {"dp": "local", "noise_multiplier": 1.0, "accountant": "pld"},
              "train": {"weighting": "uniform"}})


def test_the_methods_parameters_are_checked_and_stored_with_their_defaults():
    assert validate({"algorithm": "fedprox"}).algorithm.params == {"mu": 0.01}
    with pytest.raises(ConfigError, match=r"^fedprox: algorithm.mu: Input should be greater than or equal to 0"):
        validate({"algorithm": {"name": "fedprox", "mu": -1}})
    with pytest.raises(ConfigError, match=r"^algorithm.name: unknown algorithm 'nonesuch'"):
        validate({"algorithm": "nonesuch"})


def test_check_sections_refuses_a_config_changed_after_validation():
    cfg = validate({"algorithm": "fedavg"})
    cfg.model.precision = "16-mixed"  # each section valid on its own
    with pytest.raises(ConfigError, match="^model.precision: 16-mixed needs a GPU"):
        check_sections(cfg)


def test_dry_run_refuses_before_any_data_loads(tmp_path, capsys):
    config = write_yaml(tmp_path / "c.yaml", {"data": {"dataset": "cifar10", "root": str(tmp_path / "no-data")},
                                              "algorithm": "fedavg", "model": {"precision": "16-mixed"}})
    assert main(["run", str(config), "--dry-run"]) == 2
    assert "model.precision: 16-mixed needs a GPU" in capsys.readouterr().err


@pytest.mark.parametrize("tree, message", [
    ({"eval": {"unseen": 8}}, "eval.unseen: 8 holds out 8 of the 8 clients; hold out at least one and leave at least "
                              "one to train"),
    ({"eval": {"unseen": 0.01}}, "eval.unseen: 0.01 holds out 0 of the 8 clients; hold out at least one and leave at "
                                 "least one to train"),
    ({"algorithm": "fedavg", "system": {**ASYNC, "async_buffer": 7}, "eval": {"unseen": 2}},
     "system.async_buffer: 7 is more than the 6 clients that train; at most 6"),
    ({"algorithm": {"name": "ifca", "clusters": 9}}, "ifca: algorithm.clusters: 9 clusters for 8 clients that train; "
                                                     "at most 8"),
    ({"algorithm": "fedavg", "server": {"aggregator": "krum", "byzantine": 3}},
     "server.byzantine: krum with f=3 needs at least 9 clients a round, this run samples 8; lower server.byzantine or "
     "raise train.fraction"),
    ({"algorithm": "fedavg", "server": {"aggregator": "krum", "krum_select": 8}},
     "server.krum_select: 8 is more than the 7 replies Multi-Krum may average (clients a round 8 - server.byzantine 1)"),
])
def test_what_the_sections_ask_of_the_population_is_refused_before_data_loads(tree, message):
    with pytest.raises(ConfigError) as err:
        validate({"data": {"num_clients": 8}, **tree})
    assert str(err.value) == message


def test_a_population_that_fits_passes():
    cfg = validate({"data": {"num_clients": 8}, "eval": {"unseen": 0.25}, "algorithm": {"name": "ifca", "clusters": 6}})
    assert cfg.eval.held_out(8) == 2
    validate({"data": {"num_clients": 8}, "algorithm": "fedavg", "server": {"aggregator": "krum", "byzantine": 2}})


def test_the_work_estimate_counts_each_rounds_clients_epochs_and_fine_tuning():
    from fedsim.config.checks import client_epochs

    sync = validate({"data": {"num_clients": 10}, "train": {"rounds": 6, "fraction": 0.5, "local_epochs": 3,
                                                            "eval_every": 2}, "eval": {"finetune_epochs": 4}})
    assert client_epochs(sync) == (6 * 5 * 3, (6 // 2 + 1) * 10 * 4)
    over = validate({"data": {"num_clients": 10}, "train": {"rounds": 2, "fraction": 0.5, "local_epochs": 1},
                     "eval": {"finetune_epochs": 0}, "system": {**CLOCK, "over_selection": 0.5}})
    assert client_epochs(over) == (2 * 8, 0)  # 5 selected and half as many more: ceil(7.5)
    steps = validate({"algorithm": "fedavg", "data": {"num_clients": 10}, "eval": {"finetune_epochs": 0},
                      "train": {"rounds": 3, "local_epochs": 2}, "system": {**ASYNC, "async_buffer": 4}})
    assert client_epochs(steps) == (3 * 4 * 2, 0)  # a server step takes async_buffer reports


def test_a_run_past_the_work_bound_is_refused_with_the_estimate_and_one_below_passes():
    from fedsim.config.checks import MAX_CLIENT_EPOCHS

    tree = {"data": {"num_clients": 10}, "train": {"fraction": 1.0, "local_epochs": 1}, "eval": {"finetune_epochs": 0}}
    validate({**tree, "train": {**tree["train"], "rounds": MAX_CLIENT_EPOCHS // 10}})
    with pytest.raises(ConfigError, match=r"^train\.rounds: the run asks for 1e\+12 client-epochs \(1e\+12 of local "
                                          r"training: train\.rounds 1e\+11 x 10 clients a round x train\.local_epochs "
                                          r"1; 0 of fine-tuning.*lower train\.rounds$"):
        validate({**tree, "train": {**tree["train"], "rounds": MAX_CLIENT_EPOCHS // 10 + 1}})


DP = {"noise_multiplier": 1.0}
UNIFORM = {"weighting": "uniform"}


@pytest.mark.parametrize("tree, message", [
    ({"algorithm": "fedavg", "privacy": DP},
     "train.weighting: samples lets a client's sample count scale its update, which privacy.dp's clip norm does not "
     "bound; set train.weighting: uniform"),
    ({"algorithm": "fedavg", "privacy": DP, "train": UNIFORM, "system": ASYNC},
     "system.mode: async steps on stale updates, which privacy.dp does not account; use mode sync"),
    ({"algorithm": "fedavg", "privacy": {**DP, "dp": "local", "adaptive": {}}, "train": UNIFORM},
     "privacy.adaptive: adaptive clipping steers the clip norm by a count the server noises, which local DP has not; "
     "remove privacy.adaptive or set privacy.dp: central"),
    ({"algorithm": "fedavg", "privacy": DP, "train": UNIFORM, "model": {"batchnorm": "averaged"}},
     "model.batchnorm: averaged puts BatchNorm's running statistics into the clipped, noised update (they would "
     "dominate its norm, and a noised variance can turn negative); leave model.batchnorm unset (under DP: "
     "local_statistics) or set personal or batch_stats"),
    ({"algorithm": "fedavg", "privacy": DP, "train": {**UNIFORM, "on_nonfinite": "drop"}},
     "train.on_nonfinite: drop makes whether a client's update counts depend on its data, which the accountant does "
     "not model under fixed-size sampling; set train.on_nonfinite: stop or train.sampling: poisson"),
    ({"algorithm": "fedavg", "privacy": {**DP, "dp": "local"},
      "train": {**UNIFORM, "on_nonfinite": "drop", "sampling": "poisson"}},
     "train.on_nonfinite: drop makes whether a client's update counts depend on its data, which the accountant does "
     "not model under local DP; set train.on_nonfinite: stop"),
    ({"algorithm": "fedavg", "privacy": DP, "train": UNIFORM, "data": {"num_clients": 4}, "eval": {"unseen": 3}},
     "privacy.dp: 1 client may train (data.num_clients less eval.unseen), and DP over one client protects nobody from "
     "anybody; let at least 2 clients train or remove privacy"),
    ({"algorithm": "fedavg", "privacy": {**DP, "delta": 0.1}, "train": UNIFORM, "data": {"num_clients": 10}},
     "privacy.delta: 0.1 is at least 1/N = 0.1 for the 10 clients that may train, so the guarantee allows one "
     "client's data to leak whole; set it well below 1/N (e.g. 1e-05) or leave it null"),
])
def test_what_user_level_dp_needs_of_the_run_is_refused_with_its_line(tree, message):
    with pytest.raises(ConfigError) as err:
        validate(tree)
    assert str(err.value) == message
    validate({**tree, "privacy": {"dp": "none", "secure_aggregation": True}})  # secure aggregation alone needs neither


def test_a_dropped_clients_zero_update_is_accounted_under_central_dp_with_poisson_sampling():
    validate({"algorithm": "fedavg", "privacy": DP, "train": {**UNIFORM, "on_nonfinite": "drop", "sampling": "poisson"}})
    validate({"algorithm": "fedavg", "privacy": {**DP, "delta": 0.099}, "train": UNIFORM, "data": {"num_clients": 10}})


def test_dp_with_weights_by_sample_count_exits_2_with_one_line_before_anything_is_written(tmp_path, capsys):
    from conftest import synthetic_tree

    tree = synthetic_tree(tmp_path / "runs", privacy=DP)
    config = write_yaml(tmp_path / "c.yaml", tree)
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.weighting: samples lets a client's sample count" in err, err
    assert not (tmp_path / "runs").exists()
    tree["train"]["weighting"] = "uniform"
    validate(tree)
