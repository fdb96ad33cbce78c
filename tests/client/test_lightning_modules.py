"""A Lightning user's own module (tests/user_plugins.py) as fedsim drives it: automatic and manual optimization,
configure_optimizers honoured by parameter identity, frozen parts that cannot move, self.log, hooks and callbacks,
precision, and the contract checked before any work."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import in_process_server, lightning_runtime, lightning_tree, plan_for, round_records, train_one
from user_plugins import CALLS

from fedsim.algorithms import PARTS, WEIGHTS
from fedsim.algorithms.context import ClientContext
from fedsim.client.randomness import client_generator
from fedsim.config import validate
from fedsim.errors import ConfigError, UserCodeError
from fedsim.metrics.logger import round_row

TESTS = Path(__file__).resolve().parents[1]


def start(rt) -> dict:
    return {WEIGHTS: rt.plan.model.initial["shared"]}


def part_values(rt, prefix: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in rt.net.state_dict().items() if k.startswith(prefix)}


def context(rt, client: int = 0, round_idx: int = 1) -> ClientContext:
    ctx = ClientContext(rt, client, round_idx, start(rt), client_generator(rt.cfg.seed, round_idx, client))
    ctx.load()
    return ctx


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- frozen parts -----------------------------------------------------------------------------------
def test_fedbabu_head_stays_bit_identical_when_the_module_steps_every_optimizer(tmp_path):
    rt = lightning_runtime(tmp_path, "ManualEverything", "fedbabu")
    initial = {k: torch.from_numpy(v) for k, v in rt.plan.model.layouts["full"].arrays(rt.plan.model.initial["full"]).items()
               if k.startswith("head.")}
    body = part_values(rt, "body.")
    train_one(rt, start(rt), 0, 1)
    assert equal(part_values(rt, "head."), initial)  # the fixed head, bit for bit
    assert not equal(part_values(rt, "body."), body)  # while the body trained
    assert {type(o).__name__ for o in rt.loop.sets["train"].optimizers} == {"SGD", "Adam"}


def test_fedrep_body_cannot_move_during_its_head_epochs(tmp_path):
    rt = lightning_runtime(tmp_path, "ManualEverything", "fedrep")
    ctx = context(rt)
    body, head = part_values(rt, "body."), part_values(rt, "head.")
    ctx.sgd(PARTS["head"], 1)
    assert equal(part_values(rt, "body."), body) and not equal(part_values(rt, "head."), head)
    assert all(p.requires_grad for p in rt.net.parameters())  # thawed after the phase


def test_a_module_that_moves_a_frozen_part_by_hand_is_stopped_with_one_line(tmp_path):
    rt = lightning_runtime(tmp_path, "HeadWriter", "fedbabu")
    with pytest.raises(UserCodeError, match=r"HeadWriter changed head\.bias during a local update that trains only "
                                            r"the body \(client 0, round 1, training\)") as err:
        train_one(rt, start(rt), 0, 1)
    assert "\n" not in str(err.value)


# -- optimization ----------------------------------------------------------------------------------
def test_automatic_optimization_trains_with_the_modules_own_optimizer_and_groups(tmp_path):
    rt = lightning_runtime(tmp_path, "TwoPartModule", "fedper")
    before = rt.plan.model.initial["full"]
    uploads, loss = train_one(rt, start(rt), 0, 1)
    assert np.isfinite(loss) and not np.array_equal(rt.layouts["full"].pack(), before)  # it trained
    module = rt.loop.module
    assert module.lrs_seen == [[0.123, 0.0456]] * 2  # its own learning rates, by group, each local epoch
    assert rt.loop.sets["train"].optimizers[0].param_groups[0]["momentum"] == 0.5
    rates = rt.learning_rates("full", 1)
    spans = {k: (a, b) for k, _, a, b in rt.layouts["full"].spans()}
    assert set(rates[slice(*spans["body.1.weight"])]) == {0.123} and set(rates[slice(*spans["head.bias"])]) == {0.0456}
    assert rt.plan.model.optimizers == (
        "body: SGD (optimizer 0, group 0, 2 tensors): lr 0.123, momentum 0.5, weight_decay 0, nesterov False",
        "head: SGD (optimizer 0, group 1, 2 tensors): lr 0.0456, momentum 0.5, weight_decay 0, nesterov False")


def test_the_round_schedule_scales_a_modules_own_learning_rates(tmp_path):
    rt = lightning_runtime(tmp_path, "TwoPartModule", "fedper", train__rounds=4, train__body__schedule="step",
                           train__body__milestones=[0.5], train__body__gamma=0.1)
    spans = {k: (a, b) for k, _, a, b in rt.layouts["full"].spans()}
    late = rt.learning_rates("full", 3)
    assert np.allclose(late[slice(*spans["body.1.weight"])], 0.0123)  # x gamma after the milestone
    assert set(late[slice(*spans["head.bias"])]) == {0.0456}  # the head's schedule is constant


def test_a_dict_form_lr_scheduler_runs_within_each_local_update(tmp_path):
    rt = lightning_runtime(tmp_path, "ScheduledModule", "fedavg")
    train_one(rt, start(rt), 0, 1)
    train_one(rt, start(rt), 1, 1)
    assert rt.loop.module.lrs_seen == [[0.2], [0.1], [0.2], [0.1]]  # halves each epoch, fresh for every client


def test_fine_tuning_uses_the_modules_optimizer_types_and_eval_finetune_lr(tmp_path):
    rt = lightning_runtime(tmp_path, "ManualEverything", "fedbabu", eval__finetune_part="head", eval__finetune_lr=0.007)
    rt.evaluate(start(rt), [0], 1)
    adam = rt.loop.sets["train"].optimizers[1]
    assert type(adam).__name__ == "Adam" and all("exp_avg" in adam.state[p] for p in rt.loop.module.head.parameters())
    assert rt.loop.module.lrs_seen[-1] == [0.007, 0.007]


def test_a_training_step_that_never_backpropagates_is_a_user_error(tmp_path):
    rt = lightning_runtime(tmp_path, "ForgetsBackward", "fedavg")
    with pytest.raises(UserCodeError, match="without a backward pass, so nothing trained"):
        train_one(rt, start(rt), 0, 1)


# -- logging, hooks, callbacks ----------------------------------------------------------------------
def test_self_log_values_reach_the_records_and_the_rounds_statistics(tmp_path, monkeypatch):
    server = in_process_server(validate(lightning_tree(tmp_path, "TwoPartModule")))
    server.restore(None)
    result = server.round(1)
    sampled = set(result.sampled)
    for record in result.records:
        assert 0 <= record["val_margin"] and "val_margin_personalized" in record
        assert ("train_acc" in record and "my_loss" in record) == (record["client"] in sampled)
        assert 0 <= record.get("train_acc", 0) <= 1
    row = round_row(result)
    assert {"train_acc", "my_loss", "val_margin", "val_margin_personalized"} <= row.keys()
    assert set(row["val_margin"]) >= {"mean", "p10", "jain"}


@pytest.mark.parametrize("validation", [0.25, 0.0])
def test_a_modules_validation_step_sees_the_validation_split_and_test_step_the_test_split(tmp_path, validation):
    """With data.validation, as Lightning users expect: validation_step (and its on_validation_* hooks) on the
    validation split, its values under validation_NAME; test_step (on_test_* hooks) on test. Without, both steps
    score the test data, the only split there is."""
    rt = lightning_runtime(tmp_path, "CountsWhatItScores", "fedavg", **{"data.validation": validation,
                                                                       "eval.finetune_epochs": 0})
    CALLS.clear()
    record = rt.evaluate(start(rt), [0], 1)[0]
    if validation:
        assert record["validation_validation_samples"] == record["n_validation"] > 0
        assert record["test_samples"] == record["n_test"] > 0
        assert "validation_samples" not in record and "validation_test_samples" not in record
        assert CALLS["on_validation_start"] == CALLS["on_test_start"] == 1
    else:
        assert record["validation_samples"] == record["test_samples"] == record["n_test"]
        assert CALLS["on_validation_start"] == 1 and CALLS["on_test_start"] == 0


def test_lightning_hooks_and_callbacks_run_for_every_local_update(tmp_path):
    CALLS.clear()
    rt = lightning_runtime(tmp_path, "TwoPartModule", "fedavg",
                           model__callbacks=[{"class_path": "user_plugins:ListedCallback", "init_args": {"tag": "mine"}}])
    train_one(rt, start(rt), 0, 1)
    steps = -(-rt.plan.train_sizes[0] // 20)
    assert CALLS["on_train_start"] == 1 and CALLS["on_train_epoch_start"] == 2
    assert CALLS["on_train_batch_end"] == CALLS["mine.batch_start"] == 2 * steps
    assert CALLS["callback.on_fit_start"] == 1 and CALLS["callback.epoch_end.0"] == CALLS["callback.epoch_end.1"] == 1


def test_results_are_identical_for_one_two_and_three_workers_with_a_users_module(tmp_path, monkeypatch):
    runs = []
    for workers in (1, 2, 3):
        server = in_process_server(validate(lightning_tree(tmp_path, "TwoPartModule", engine__workers=workers)))
        server.restore(None)
        runs.append(round_records([server.round(1), server.round(2)]))
    assert runs[0] == runs[1] == runs[2]


def test_bf16_mixed_precision_trains_through_fabric_and_16_mixed_needs_a_gpu(tmp_path):
    full = lightning_runtime(tmp_path, "TwoPartModule", "fedavg")
    mixed = lightning_runtime(tmp_path, "TwoPartModule", "fedavg", model__precision="bf16-mixed")
    (a, loss_a), (b, loss_b) = train_one(full, start(full), 0, 1), train_one(mixed, start(mixed), 0, 1)
    assert np.isfinite(loss_b) and not np.array_equal(a[WEIGHTS], b[WEIGHTS])  # autocast changed the arithmetic
    np.testing.assert_allclose(a[WEIGHTS], b[WEIGHTS], atol=0.05)
    with pytest.raises(ConfigError, match="model.precision: 16-mixed needs a GPU"):
        plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", model__precision="16-mixed")))


# -- the contract, checked before work ------------------------------------------------------------------
@pytest.mark.parametrize("over, message", [
    ({"model__client": "user_plugins:NeedsWidth"}, r"model.client: NeedsWidth\(\*\*model.client_args\) raised TypeError"),
    ({"model__client": "user_plugins:NotLightning"}, "is not a class subclassing pytorch_lightning.LightningModule"),
    ({"model__client": "user_plugins:TwoOptimizersAutomatic"}, "returns 2 optimizers with automatic optimization"),
    ({"model__personal_layers": 2}, "model.personal_layers: 2 needs a fedsim SplitNet's blocks"),
    ({"model__head": ["classifier"]}, r"model.head: 'classifier' is not a submodule of TwoPartModule \(its submodules: "
                                      "body, head, train_acc\\)"),
])
def test_a_broken_contract_is_one_line_before_any_work(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message) as err:
        plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", **over)))
    assert "\n" not in str(err.value)


def test_client_args_and_model_head_shape_the_module_and_its_split(tmp_path):
    plan = plan_for(validate(lightning_tree(tmp_path, "NeedsWidth", model__client_args={"width": 8})))
    assert plan.model.keys.head == ("head.weight", "head.bias")
    plan = plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", model__head=["body.1", "head"],
                                            model__client_args={"hidden": 4})))
    assert plan.model.keys.head == ("body.1.weight", "body.1.bias", "head.weight", "head.bias")
    assert plan.model.layouts["shared"].size == 0  # FedPer with everything in the head shares nothing


def test_the_builtin_client_shows_its_config_optimizers_per_part(tmp_path, data_root):
    from conftest import small_config

    plan = plan_for(small_config(tmp_path, data_root))
    assert plan.model.client == "FedClient(cnn4)"
    assert [line.split(" (")[0] for line in plan.model.optimizers] == ["body: SGD", "head: SGD"]


def test_a_users_module_that_raises_under_way_is_one_line_exit_4_never_retried_and_resumable_as_printed(tmp_path):
    import shlex

    import yaml

    config = tmp_path / "broken.yaml"
    # Ray's: the module tells the driver's rehearsal from a worker by whether Ray is up
    config.write_text(yaml.safe_dump(lightning_tree(tmp_path, "BrokenUnderWay", engine__workers=1, engine__backend="ray")))
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "fedsim.cli.main", "run", str(config), "--quiet"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr[-2000:]  # 2 means nothing written; this run's folder exists
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fedsim: error:")]
    assert len(errors) == 1 and "BrokenUnderWay.training_step raised ValueError: boom in a worker" in errors[0]
    assert "memory" not in proc.stderr and "keeps its config and partition, no checkpoint yet" in errors[0]
    printed = errors[0].split("`")[-2]
    assert printed.endswith("--trust-plugins")  # its config names the module: resume refuses it otherwise
    resumed = subprocess.run([sys.executable, "-m", "fedsim.cli.main", *shlex.split(printed)[1:], "--dry-run"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]


# -- the opt-in Trainer loop -----------------------------------------------------------------------------
@pytest.mark.parametrize("client, algorithm", [("TwoPartModule", {"name": "fedprox", "mu": 0.5}),
                                               ("ManualEverything", "fedbabu"), ("ScheduledModule", "fedavg")])
def test_the_trainer_loop_gives_the_fabric_loops_results_bit_for_bit(tmp_path, client, algorithm):
    fabric = lightning_runtime(tmp_path, client, algorithm)
    trainer = lightning_runtime(tmp_path, client, algorithm, model__client_loop="trainer")
    (a, loss_a), (b, loss_b) = train_one(fabric, start(fabric), 0, 1), train_one(trainer, start(trainer), 0, 1)
    assert loss_a == loss_b and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(fabric.layouts["full"].pack(), trainer.layouts["full"].pack())  # the fixed head too
    assert fabric.evaluate(start(fabric), [1], 1) == trainer.evaluate(start(trainer), [1], 1)


# -- the page that documents it ------------------------------------------------------------------------------
def test_the_documented_module_runs_logs_and_shows_its_optimizers(tmp_path, monkeypatch):
    import yaml

    text = (TESTS.parent / "docs" / "lightning.md").read_text()
    (tmp_path / "my_module.py").write_text(text.split("```python\n")[1].split("```")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    documented = yaml.safe_load(text.split("```yaml\n")[1].split("```")[0])
    tree = lightning_tree(tmp_path, "unused", documented["algorithm"], train__local_epochs=1)
    tree["model"] = documented["model"]  # the page's module, on the blobs data (seconds)
    cfg = validate(tree)
    printed = text.split("prints its optimizers per part:\n\n```\n")[1].split("```")[0].splitlines()
    assert list(plan_for(cfg).model.optimizers) == [line.strip() for line in printed[1:]]
    server = in_process_server(cfg)
    server.restore(None)
    result = server.round(1)
    trained = [r for r in result.records if r["client"] in result.sampled]
    assert trained and all({"train_acc", "train_loss_own", "val_confidence", "val_confidence_personalized"} <= r.keys()
                           for r in trained)
    assert server.pool.workers[0].runtime.loop.module.epochs_seen >= 1  # its callback ran


def test_optimizers_map_to_parts_by_parameter_identity_not_position(tmp_path):
    rt = lightning_runtime(tmp_path, "HeadFirstOptimizers", "fedper")
    assert [line.split(" (")[0] for line in rt.plan.model.optimizers] == ["head: Adam", "body: SGD"]
    spans = {k: (a, b) for k, _, a, b in rt.layouts["full"].spans()}
    rates = rt.learning_rates("full", 1)
    assert set(rates[slice(*spans["head.weight"])]) == {0.003} and set(rates[slice(*spans["body.1.bias"])]) == {0.3}


def test_logged_values_reduce_as_lightning_reduces_an_epoch():
    import torchmetrics

    from fedsim.client.logged import LoggedValues

    logged = LoggedValues("M")
    metric = torchmetrics.MeanMetric()
    for batch_size, value in ((10, 1.0), (30, 3.0)):
        logged.batch_size = batch_size
        logged.add("mean", torch.tensor(value))
        logged.add("top", value, reduce_fx="max")
        logged.add("total", value, reduce_fx=torch.sum)
        metric.update(value)
        logged.add("metric", metric)
    assert logged.collect("_x") == {"mean_x": 2.5, "top_x": 3.0, "total_x": 4.0, "metric_x": 2.0}
    assert logged.collect() == {}  # a clean slate for the next client
    logged.add("acc", 0.5)
    with pytest.raises(UserCodeError, match="logged 'acc', a name fedsim's own records use"):
        logged.collect()


def test_dry_run_of_a_module_that_cannot_be_built_exits_2_with_one_line(tmp_path, capsys):
    import yaml

    from fedsim.cli.main import main

    config = tmp_path / "needs.yaml"
    config.write_text(yaml.safe_dump(lightning_tree(tmp_path, "NeedsWidth")))
    assert main(["run", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.client: NeedsWidth(**model.client_args) raised TypeError" in err
    assert main(["run", str(config), "--dry-run", "model.client_args.width=8"]) == 0
    out = capsys.readouterr().out
    assert "user_plugins:NeedsWidth, optimizers from train.body / train.head" in out


# -- Lightning's own callbacks (issue 46 item 2) -------------------------------------------------------------------
def test_lightnings_checkpoint_and_early_stopping_run_each_local_update_under_the_trainer_loop(tmp_path):
    """Both class_path spellings; EarlyStopping reads what the module logs (trainer.callback_metrics), ModelCheckpoint
    writes into the run folder's lightning/."""
    import warnings

    rt = lightning_runtime(tmp_path, "TwoPartModule", "fedavg", model__client_loop="trainer", model__callbacks=[
        "pytorch_lightning.callbacks:ModelCheckpoint",
        {"class_path": "pytorch_lightning.callbacks.EarlyStopping", "init_args": {"monitor": "my_loss"}}])
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for client, round_idx in ((0, 1), (1, 1), (0, 2)):
            train_one(rt, start(rt), client, round_idx)
    # Issue 67 item 4: each file named by its client and round (no -v1, -v2 of one name), and Lightning's own
    # warnings (its deprecations, "Checkpoint directory ... exists") in the run's log, once each, never shown.
    lightning = tmp_path / "lm" / "lightning"
    assert sorted(p.name.split("-epoch=")[0] for p in (lightning / "checkpoints").glob("*.ckpt")) == [
        "client=0-round=1", "client=0-round=2", "client=1-round=1"]
    assert not [w for w in shown if "lightning" in w.filename], [str(w.message) for w in shown]
    logged = (lightning / "warnings.log").read_text().splitlines()
    assert any("Checkpoint directory" in line for line in logged) and len(logged) == len(set(logged))


def test_a_callback_that_needs_a_trainer_is_refused_under_the_fabric_loop_naming_it_and_the_fix(tmp_path):
    with pytest.raises(UserCodeError, match=r"^model.callbacks: ModelCheckpoint.setup raised AttributeError: .*; it "
                                            r"needs a pl.Trainer, .*set model.client_loop: trainer$"):
        lightning_runtime(tmp_path, "TwoPartModule", model__callbacks=["pytorch_lightning.callbacks.ModelCheckpoint"])


def test_any_exception_setting_up_a_worker_is_the_users_error_told_by_its_first_call(tmp_path):
    from fedsim.client.worker import Worker

    plan = plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", model__callbacks=["user_plugins:SetupFails"])))
    worker = Worker(plan, dict(enumerate(plan.clients)))
    assert worker.ping() and isinstance(worker.failure, UserCodeError)
    assert "SetupFails.setup raised RuntimeError: no licence for this callback" in str(worker.failure)
    with pytest.raises(UserCodeError):
        worker.device_info()


@pytest.mark.parametrize("spec, message", [
    ("user_plugins.Nowhere", "model.callbacks: cannot import 'user_plugins:Nowhere'"),
    ({"class_path": "user_plugins:ListedCallback", "init_args": {"colour": 1}},
     "model.callbacks: user_plugins:ListedCallback cannot be made with init_args"),
    ("user_plugins:CallbackRow", "model.callbacks: 'user_plugins:CallbackRow' is not a class subclassing "
     "pytorch_lightning.Callback"),
])
def test_a_bad_callback_is_refused_by_the_driver_before_any_worker(tmp_path, spec, message):
    with pytest.raises(ValueError, match=message):
        plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", model__callbacks=[spec])))


def test_a_callback_path_is_refused_at_validation_when_it_names_no_class():
    with pytest.raises(ConfigError, match="model.callbacks.*'EarlyStopping': give the callback's class as"):
        validate({"model": {"callbacks": ["EarlyStopping"]}})


def test_configure_callbacks_may_return_any_sequence(tmp_path):
    CALLS.clear()
    rt = lightning_runtime(tmp_path, "RowOfCallbacks", "fedavg")
    train_one(rt, start(rt), 0, 1)
    assert CALLS["callback.on_fit_start"] == 1 and CALLS["row.batch_start"] > 0


@pytest.mark.parametrize("loop", ["fabric", "trainer"])
def test_a_training_step_dict_without_loss_is_refused_in_either_loop(tmp_path, loop):
    rt = lightning_runtime(tmp_path, "DictWithoutLoss", "fedavg", model__client_loop=loop)
    with pytest.raises(UserCodeError, match="DictWithoutLoss.training_step returned a dict without a 'loss' key"):
        train_one(rt, start(rt), 0, 1)
