"""`fedsim tune` on the command line: the dry run's count of runs and budget; bad input refused in one line, exit 2,
before anything is written."""
import json

import pytest

from conftest import fedsim_cli, lightning_tree, read_jsonl, synthetic_tree, tune_tree, write_yaml
from fedsim.cli.main import main


@pytest.mark.parametrize("over, message", [
    ({"data": {"validation": 0.0}}, "data.validation: fedsim tune chooses each method's settings on the validation "
                                    "split, and this config has none; set data.validation"),
    ({"tune": {"methods": ["fedavg", "fedavg"]}}, "tune.methods: fedavg is listed twice"),
    ({"tune": {"methods": []}}, "tune.methods"),
    ({"tune": {"seeds": [1, 1]}}, "tune.seeds: give distinct seeds"),
    ({"tune": {"space": {"lrr": {"choice": [0.1]}}}}, "tune.space.lrr: not a setting tune can search; did you mean lr?"),
    ({"tune": {"space": {"seed": {"choice": [1, 2]}}}}, "tune.space.seed: not a setting tune can search"),
    ({"sweep": {"seed": [1, 2]}}, "sweep: fedsim tune draws its own runs"),
])
def test_bad_tuning_configs_are_one_line_exit_2_before_anything_runs(tmp_path, capsys, over, message):
    tree = tune_tree(tmp_path)
    for section, value in over.items():
        tree[section] = {**tree.get(section, {}), **value} if isinstance(value, dict) else value
    assert main(["tune", str(write_yaml(tmp_path / "bad.yaml", tree))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "_sweeps").exists() and not (tmp_path / "tune").exists()


def test_a_config_without_a_tune_section_is_refused(tmp_path, capsys):
    assert main(["tune", str(write_yaml(tmp_path / "plain.yaml", synthetic_tree(tmp_path)))]) == 2
    assert "tune: this config has no tune section" in capsys.readouterr().err


def test_dry_run_prints_the_count_of_runs_and_the_budget(tmp_path, capsys):
    assert main(["tune", str(write_yaml(tmp_path / "t.yaml", tune_tree(tmp_path))), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    # 3 methods x 3 shared trials x 2 seeds; 2 own trials each x 2 seeds; 3 x 2 final
    assert out[0] == "36 runs: 18 stage-1 + 12 stage-2 search + 6 final (3 methods)"
    assert out[1] == ("budget: stage 1: 3 draws of the shared space, each method at its own defaults (3 trials); "
                      "stage 2: 2 trials of each method's own parameters at its stage-1 choice (the step refined where "
                      "it has none); each trial x 2 search seed(s) (0, 1) x 1 rounds; the chosen settings at 2 seeds "
                      "(0..1) x 1 rounds")
    assert out[2] == "stage-1 runs finished: 0 of 18 (a rerun trains only the rest)"
    assert out[3] == "shared space: lr loguniform [0.01, 0.1]; momentum choice [0.0, 0.9]"
    assert out[5] == "fedprox: 3 stage-1 trials; own space: algorithm.mu choice [0.001, 0.01, 0.1, 1.0]"
    assert out[-1].startswith("time: about ") and "one run after another, from each method's first trial" in out[-1]
    assert not (tmp_path / "_sweeps").exists()


def test_a_key_a_users_module_never_reads_is_refused_at_dry_run_naming_what_it_does_instead(tmp_path, capsys):
    """Issue 67 item 1: tune.space.lr sets train.body/head.lr, which a module with its own configure_optimizers
    never reads: every trial would train alike while the table reported a chosen lr."""
    tree = _own_module_tuning(tmp_path, {"lr": {"loguniform": [0.001, 0.1]}})
    assert main(["tune", str(write_yaml(tmp_path / "adam.yaml", tree)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedsim: error: tune.space.lr: user_plugins:AdamModule makes its own "
                                                  "optimizers in configure_optimizers, which train.body.lr"), err
    assert "tune the module's own argument instead (e.g. tune.space: {model.client_args.lr:" in err
    tree = _own_module_tuning(tmp_path, {"model.client_args.lrr": {"loguniform": [0.001, 0.1]}})
    assert main(["tune", str(write_yaml(tmp_path / "adam.yaml", tree)), "--dry-run"]) == 2
    assert capsys.readouterr().err == ("fedsim: error: tune.space.model.client_args.lrr: AdamModule.__init__ takes no "
                                       "'lrr' (it takes num_classes, in_channels, image_size, lr); tune one of its "
                                       "arguments\n")
    tree = _own_module_tuning(tmp_path, {"model.client_args.lr": {"loguniform": [0.001, 0.1]}})
    assert main(["tune", str(write_yaml(tmp_path / "adam.yaml", tree)), "--dry-run"]) == 0
    # FedAvg has no own parameters and the shared settings no lr to refine: stage 2 has nothing to run
    assert capsys.readouterr().out.startswith("3 runs: 2 stage-1 + 0 stage-2 search + 1 final (1 methods)")


@pytest.mark.slow
def test_tuning_a_users_adam_module_on_its_own_lr_trains_each_trial_apart_and_the_receipt_prints_adams_lr(tmp_path):
    space = {"model.client_args.lr": {"loguniform": [0.0001, 0.1]}}
    tree = _own_module_tuning(tmp_path, space)
    config = write_yaml(tmp_path / "adam.yaml", tree)
    assert fedsim_cli("tune", str(config), "--dry-run").returncode == 0
    proc = fedsim_cli("tune", str(config), "--quiet", "--max-concurrent", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    searched = [read_jsonl(tmp_path / f"ad-fedavg-t{k}-s0" / "metrics.jsonl") for k in (0, 1)]
    assert [r["loss"] for r in searched[0]] != [r["loss"] for r in searched[1]]  # each trial trained at its lr
    table = json.loads((tmp_path / "tune" / "ad" / "results.json").read_text())
    [row] = table["methods"]
    chosen = row["chosen"]["model.client_args.lr"]
    assert row["receipt"]["optimizer"] == "Adam" and row["receipt"]["lr"] == f"{chosen:g}", row["receipt"]
    assert f"| Adam | {chosen:g} | betas (0.9, 0.999) |" in (tmp_path / "tune" / "ad" / "results.md").read_text()


def _own_module_tuning(tmp_path, space: dict) -> dict:
    """A tuning of user_plugins:AdamModule (its own Adam at its own lr argument) on the blobs data: 2 trials, 1 round."""
    tree = lightning_tree(tmp_path, "AdamModule", "fedavg", **{"data.validation": 0.2, "engine.workers": 1,
                                                                "eval.finetune_epochs": 0})
    tree["name"] = "ad"
    tree["tune"] = {"methods": ["fedavg"], "trials": 2, "rounds": 1, "seeds": [0], "final_seeds": 1, "space": space}
    return tree
