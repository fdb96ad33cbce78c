"""Issue 46 item 7: every refusal a run makes before its first round (after the config validated) is made by
`--dry-run` too, with the same line. The list comes from reading what runs between validation and round 1:
load_inputs (data, plug-ins, init_from, the module and its optimizers, callbacks, traces), RunFolder.open (an
existing folder, a resume's files), and the rehearsal (one training step of the module: no backward pass, a dict
without loss, a callback that needs a Trainer, a logged name fedsim's records use); for a sweep, search.metric."""
import pytest

from conftest import lightning_tree, write_yaml
from fedsim.cli.main import main

REFUSALS = [  # (settings over a small run of the user's module, what the one line says)
    ({"data.dataset": "cifar10", "data.root": "/nonexistent/data", "data.partition": "iid", "model.client": None},
     "data.root: no CIFAR-10 found under /nonexistent/data"),
    ({"model.client": "user_plugins:Nope"}, "model.client: cannot import 'user_plugins:Nope'"),
    ({"model.init_from": "no-such-run"}, "model.init_from: cannot read"),
    ({"system.devices.trace": "no-such.csv"}, "system.devices.trace"),
    ({"model.callbacks": [{"class_path": "user_plugins:ListedCallback", "init_args": {"colour": 1}}]},
     "model.callbacks: user_plugins:ListedCallback cannot be made with init_args"),
    ({"model.callbacks": ["pytorch_lightning.callbacks.ModelCheckpoint"]},
     "model.callbacks: ModelCheckpoint.setup raised AttributeError"),
    ({"model.client": "user_plugins:ForgetsBackward"}, "without a backward pass"),
    ({"model.client": "user_plugins:DictWithoutLoss"}, "returned a dict without a 'loss' key"),
    ({"model.client": "user_plugins:LogsAcc"}, "logged 'acc', a name fedsim's own records use"),
    ({"name": "exists"}, "run folder already exists"),
]


@pytest.mark.parametrize("settings, message", REFUSALS, ids=[m.split(":")[0][:40] for _, m in REFUSALS])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_run_and_its_dry_run_refuse_alike_before_ray(tmp_path, capsys, monkeypatch, settings, message, dry):
    monkeypatch.chdir(tmp_path)
    tree = lightning_tree(tmp_path, "TwoPartModule", **{"logging.wandb.mode": "disabled"})
    for key, value in settings.items():
        section, _, leaf = key.rpartition(".")
        node = tree
        for part in filter(None, section.split(".")):
            node = node.setdefault(part, {})
        node[leaf] = value
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "config.yaml").write_text("name: exists\n")
    config = write_yaml(tmp_path / "run.yaml", tree)
    assert main(["run", str(config), "--quiet", *(["--dry-run"] if dry else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "run.yaml"]  # nothing written


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_sweeps_metric_is_checked_against_what_its_runs_report(tmp_path, capsys, dry):
    tree = lightning_tree(tmp_path, "TwoPartModule", sweep={"seed": [1]}, search={"metric": "fairness/bogus"})
    config = write_yaml(tmp_path / "s.yaml", tree)
    assert main(["sweep", str(config), *(["--dry-run"] if dry else [])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "search.metric: lm-1 never reports 'fairness/bogus'" in err, err


def test_a_sweeps_dry_run_times_each_trial_and_the_sweep(tmp_path, capsys):
    tree = lightning_tree(tmp_path, "TwoPartModule", sweep={"seed": [1, 2]})
    assert main(["sweep", str(write_yaml(tmp_path / "s.yaml", tree)), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("of training and fine-tuning at the ") == 2 and "time: about" in printed, printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing written


def test_a_run_of_several_variants_refuses_a_bad_one_before_the_first_trains(tmp_path, capsys):
    tree = lightning_tree(tmp_path, "TwoPartModule", sweep={"model.client": ["user_plugins:TwoPartModule",
                                                                             "user_plugins:ForgetsBackward"]})
    assert main(["run", str(write_yaml(tmp_path / "two.yaml", tree)), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ForgetsBackward.training_step ran" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two.yaml"]  # the first variant never started
