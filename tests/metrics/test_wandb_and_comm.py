"""W&B offline logging read back from the .wandb file; communication accounting from real payloads."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedsim.models import build_model

from fedsim.config import validate
from fedsim.simulate import run
from fedsim.core.protocol import serialized_size
from fedsim.metrics.wandb_files import history as wandb_history, record as wandb_record, table as wandb_table


def config(tmp_path, data_root, name, algorithm, **extra):
    return validate({
        "name": name, "seed": 2, "algorithm": algorithm, "out_dir": str(tmp_path),
        "data": {"root": str(data_root), "num_clients": 5, "k": 2, "train_fraction": 0.01, "test_fraction": 0.02},
        "train": {"rounds": 2, "local_epochs": 1, "fraction": 0.6},
        "eval": {"finetune_epochs": 0},
        "engine": {"round_timeout_s": 300},
        **extra,
    })


def test_wandb_offline_run_has_a_curve_per_client_and_syncs(tmp_path, data_root, local_ray):
    cfg = config(tmp_path, data_root, "wb", "fedper",
                 logging={"wandb": {"mode": "offline", "project": "fedsim-test", "group": "g", "tags": ["t"]}})
    res = run(cfg)
    [offline] = list((res.run_dir / "wandb").glob("offline-run-*"))
    history = wandb_history(offline)
    per_round = [h for h in history if "fairness/acc_mean" in h]
    assert [h["round"] for h in per_round] == [1, 2]
    for h in per_round:  # loss curves beside the accuracies
        assert h["loss/train_mean"] > 0 and h["loss/test_mean"] > 0
    assert wandb_record(offline, "run").job_type == "fedper"
    for client in range(5):  # one series per client, every round
        assert all(f"client_acc/{client:05d}" in h for h in per_round)
    final = json.loads((res.run_dir / "summary.json").read_text())
    assert per_round[-1]["client_acc/00003"] == final["per_client_acc"]["3"]
    assert any(h.get("final/client_acc_hist/_type") == "histogram" for h in history)
    _check_dashboard_tables(offline, history, res.run_dir)
    drawn = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "docs" / "dashboard.py"), str(res.run_dir),
                            "--out", str(tmp_path / "charts")], capture_output=True, text=True, timeout=120)
    assert drawn.returncode == 0, drawn.stderr  # docs/dashboard.md's charts, drawn from what W&B received
    assert sorted(p.name for p in (tmp_path / "charts").iterdir()) == [
        "dashboard-every-client.png", "dashboard-fairness.png", "dashboard-partition.png"]
    dry = subprocess.run([sys.executable, "-m", "wandb", "sync", "--dry-run", str(offline)],
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr


def _check_dashboard_tables(offline: Path, history: list[dict], run_dir: Path) -> None:
    """The partition at start, each round's client table, the table of every round behind the one chart of every
    client, and the fairness section in percent, all equal to what the run folder holds."""
    stats = json.loads((run_dir / "partition_stats.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    [start] = [h for h in history if "partition/clients/_type" in h]
    assert start["round"] == 0
    partition = wandb_table(offline, start, "partition/clients")
    assert [sum(v for k, v in row.items() if k.startswith("class_")) for row in partition] == stats["train_sizes"]
    assert [row["classes"] for row in partition] == [len(c) for c in stats["classes_per_client"]]
    per_round = [h for h in history if "fairness/acc_mean" in h]
    for h, row in zip(per_round, rounds):
        assert h["fairness/acc_mean"] == pytest.approx(100 * row["acc"]["mean"]) and h["fairness/acc_jain"] == row["acc"]["jain"]
        clients = wandb_table(offline, h, "clients/round_table")
        expected = [m for m in metrics if m["round"] == row["round"]]
        assert [(c["client"], c["round"], c["n_train"], c["times_sampled"]) for c in clients] == \
            [(m["client"], m["round"], m["n_train"], m["times_sampled"]) for m in expected]
        assert [c["acc"] for c in clients] == pytest.approx([100 * m["acc"] for m in expected])
        assert [c["classes"] for c in clients] == [len(stats["classes_per_client"][m["client"]]) for m in expected]
    [end] = [h for h in history if "clients/accuracy_table/_type" in h]
    assert len(wandb_table(offline, end, "clients/accuracy_table")) == len(metrics)
    chart = wandb_table(offline, end, "clients/acc_chart_table")  # the line series: one line per client
    assert {row["lineKey"] for row in chart} == {f"client {c}" for c in range(5)}


def test_communication_is_what_is_serialised_and_fedper_sends_less(tmp_path, data_root, local_ray):
    avg = run(config(tmp_path, data_root, "avg", "fedavg"))
    per = run(config(tmp_path, data_root, "per", "fedper"))
    rows = [json.loads(line) for line in (per.run_dir / "comm.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 3  # f = 0.6 of 5 clients, 2 rounds
    # FedPer's payload = the serialised body: all of cnn4's state minus Linear(256, 10).
    head_floats = 256 * 10 + 10
    up_avg = json.loads((avg.run_dir / "summary.json").read_text())["comm"]["bytes_up"]
    up_per = json.loads((per.run_dir / "summary.json").read_text())["comm"]["bytes_up"]
    assert up_avg - up_per == 6 * 4 * head_floats
    body_floats = sum(p.numel() for p in build_model(
        "cnn4", 10, (3, 32, 32)).state_dict().values()) - head_floats
    assert rows[0]["bytes_up"] == serialized_size(np.zeros(body_floats, np.float32))
    assert rows[0]["bytes_down"] == rows[0]["bytes_up"]  # FedPer sends the body both ways


def test_resumed_run_continues_its_wandb_run_without_logging_a_round_twice(tmp_path, data_root, local_ray):
    from fedsim.engine.runfolder_checks import load_run_config

    first = run(config(tmp_path, data_root, "wbr", "fedper", logging={"wandb": {"mode": "offline"}}))
    (first.run_dir / "checkpoints" / "latest").write_text("round-0001")  # as if it crashed after logging round 2
    second = run(load_run_config(first.run_dir, ["train.rounds=3"]), resume=True)
    runs = sorted((second.run_dir / "wandb").glob("offline-run-*"))  # named offline-run-<start time>-<id>
    saved_id = json.loads((second.run_dir / "wandb_run.json").read_text())["id"]
    assert len(runs) == 2 and {wandb_record(p, "run").run_id for p in runs} == {saved_id}
    logged = [[h["round"] for h in wandb_history(p) if "fairness/acc_mean" in h] for p in runs]
    assert logged == [[1, 2], [3]]  # round 2 was redone after the resume, but W&B had it already
    assert wandb_record(runs[0], "run").run_group == "wbr"  # group: the config's name


def test_failed_run_is_marked_failed_in_wandb(tmp_path, data_root, local_ray):
    import pytest

    from fedsim.errors import TrainingDiverged

    huge = {"lr": 1e30, "momentum": 0.9, "weight_decay": 0}
    cfg = config(tmp_path, data_root, "wbf", "fedper", logging={"wandb": {"mode": "offline"}},
                 train={"rounds": 2, "local_epochs": 1, "body": huge, "head": huge})
    with pytest.raises(TrainingDiverged):
        run(cfg)
    [offline] = list((tmp_path / "wbf" / "wandb").glob("offline-run-*"))
    assert wandb_record(offline, "exit").exit_code == 1


def test_a_sweep_variants_seeds_share_a_wandb_group_and_methods_never_do():
    from fedsim.sweep.expand import expand_sweep

    variants = expand_sweep({"name": "quick", "sweep": {"algorithm": ["fedavg", "fedper"], "seed": [0, 1]}})
    assert [(v.name, v.logging.wandb.group) for v in variants] == [
        ("quick-fedavg-0", "quick-fedavg"), ("quick-fedavg-1", "quick-fedavg"),  # seeds average together ...
        ("quick-fedper-0", "quick-fedper"), ("quick-fedper-1", "quick-fedper")]  # ... methods never
    chosen = expand_sweep({"name": "quick", "logging": {"wandb": {"group": "mine"}}, "sweep": {"seed": [1, 2]}})
    assert {v.logging.wandb.group for v in chosen} == {"mine"}


def test_a_users_self_log_values_reach_wandb_beside_the_accuracies_with_a_spread_only_where_clients_differ(
        tmp_path, monkeypatch):
    import wandb

    from fedsim.core.protocol import RoundResult
    from fedsim.metrics.wandb_sink import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbLogger()
    sink.run = wandb.init(project="fedsim-test", dir=str(tmp_path), mode="offline")
    sink.per_client_limit, sink.state_path, sink.logged_through = 10, tmp_path / "state.json", 0
    sink.bytes_total, sink.classes = 0, [2, 2, 2]
    records = [{"client": c, "round": 1, "n_train": 10, "n_test": 5, "loss": 1.0, "acc": 0.5, "train_loss": 0.7,
                "times_sampled": 1, "val_margin": 0.1 * (c + 1), "lr": 0.01} for c in range(3)]
    sink.on_round_end(None, RoundResult(1, [0, 1, 2], [], records, [{"bytes_up": 1, "bytes_down": 2}], 1.0))
    sink.run.finish()
    [offline] = list((tmp_path / "wandb").glob("offline-run-*"))
    [row] = [h for h in wandb_history(offline) if "fairness/acc_mean" in h]
    assert row["val_margin/mean"] == pytest.approx(0.2) and row["val_margin/min"] == 0.1 and "val_margin/jain" in row
    # A learning rate every client logged alike is one curve, not a fairness statistic.
    assert row["lr/mean"] == 0.01 and not any(key.startswith("lr/") and key != "lr/mean" for key in row)


def test_a_dp_runs_epsilon_reaches_rounds_jsonl_wandb_and_the_summary(tmp_path, local_ray):
    """Each round's epsilon, looked up by the server in the plan the driver computed, in every file a user reads."""
    from conftest import synthetic_tree

    tree = synthetic_tree(tmp_path, "dp", algorithm="fedavg", **{"train.sampling": "poisson", "train.fraction": 0.25,
                                                                  "train.rounds": 3, "train.eval_every": 3, "train.weighting": "uniform",
                                                                  "eval.finetune_epochs": 0})
    tree |= {"privacy": {"noise_multiplier": 1.0}, "logging": {"wandb": {"mode": "offline", "project": "fedsim-test"}}}
    res = run(validate(tree))
    rows = [json.loads(line) for line in (res.run_dir / "rounds.jsonl").read_text().splitlines()]
    spent = [row["privacy/epsilon"] for row in rows]
    assert len(spent) == 3 and spent == sorted(spent) and spent[0] > 0
    [offline] = list((res.run_dir / "wandb").glob("offline-run-*"))
    assert [h["privacy/epsilon"] for h in wandb_history(offline) if "privacy/epsilon" in h] == spent
    privacy = json.loads((res.run_dir / "summary.json").read_text())["privacy"]
    assert privacy["epsilon"] == spent[-1] and privacy["noise_multiplier"] == 1.0 and privacy["q"] == 0.25
    assert (privacy["accountant"], privacy["sampling"], privacy["calibrated"]) == ("rdp", "poisson", False)
