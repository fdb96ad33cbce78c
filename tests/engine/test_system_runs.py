"""Runs on the virtual clock through the engine: an ideal device population changes nothing, heterogeneous ones
are bit-identical for any number of workers and after a resume, and the run folder and summary say who took part
and when (tests/plan/test_system.py checks the clock itself)."""
import json

import numpy as np
import pytest
from conftest import (fedsim_cli, in_process_server, read_jsonl, round_records, six_client_run,
                      synthetic_tree, write_yaml)

from fedsim.core.protocol import WEIGHTS

ROUNDS = 3
HETEROGENEOUS = {"devices": {"preset": "lognormal", "sigma": 1.0}, "dropout": 0.25, "over_selection": 0.5,
                 "deadline_s": 3.0, "availability": {"pattern": "diurnal", "period_s": 20.0, "on_fraction": 0.7}}


def _rounds(monkeypatch, cfg, rounds=ROUNDS, ckpt=None, first=1):
    server = in_process_server(cfg)
    server.restore(ckpt)
    return server, [server.round(r) for r in range(first, rounds + 1)]


def test_uniform_devices_without_dropout_give_todays_results_bit_for_bit(tmp_path, data_root, monkeypatch):
    _, ideal = _rounds(monkeypatch, six_client_run(tmp_path, data_root, "fedper", 2, ROUNDS, eval_every=1))
    clocked_cfg = six_client_run(tmp_path, data_root, "fedper", 2, ROUNDS, eval_every=1,
                                 system={"devices": {"preset": "uniform"}})
    server, clocked = _rounds(monkeypatch, clocked_cfg)
    assert round_records(clocked) == round_records(ideal)
    assert all(not o.timing for o in ideal)
    assert [o.timing["selected"] for o in clocked] == [3] * ROUNDS and all(o.timing["sim_seconds"] > 0 for o in clocked)
    assert clocked_cfg.model_dump()["system"]["devices"] and server.plan.fingerprint != in_process_server(
        six_client_run(tmp_path, data_root, "fedper", 2, ROUNDS)).plan.fingerprint


@pytest.mark.parametrize("algorithm", ["fedper", "scaffold", "ditto"])
def test_devices_dropouts_and_deadlines_are_bit_identical_on_one_two_and_three_workers(tmp_path, data_root,
                                                                                        monkeypatch, algorithm):
    results = []
    for workers in (1, 2, 3):
        server, outcomes = _rounds(monkeypatch, six_client_run(tmp_path, data_root, algorithm, workers, ROUNDS,
                                                               eval_every=1, system=HETEROGENEOUS))
        results.append((round_records(outcomes), [o.timing for o in outcomes], server.state))
    (one, t1, s1), (two, t2, s2), (three, t3, s3) = results
    assert one == two == three and t1 == t2 == t3
    assert all(np.array_equal(s1[k], s[k]) for s in (s2, s3) for k in s1)
    taking_part = [o[1] for o in one]
    assert any(len(p) < 3 for p in taking_part), taking_part  # the system settings did bite
    times = [r["times_sampled"] for r in one[-1][2]]
    assert sum(times) == sum(len(p) for p in taking_part)  # participation counts who trained, not who was selected


def test_a_resumed_heterogeneous_run_equals_an_undisturbed_one(tmp_path, data_root, monkeypatch):
    cfg = six_client_run(tmp_path, data_root, "fedper", 2, ROUNDS, eval_every=1, system=HETEROGENEOUS)
    _, straight = _rounds(monkeypatch, cfg)
    first, head = _rounds(monkeypatch, cfg, rounds=1)
    ckpt = first.checkpoint(str(tmp_path / "run"), 1)
    resumed = six_client_run(tmp_path, data_root, "fedper", 3, ROUNDS, eval_every=1, system=HETEROGENEOUS)
    _, tail = _rounds(monkeypatch, resumed, ckpt=ckpt, first=2)
    assert round_records(head + tail) == round_records(straight)
    assert [o.timing for o in head + tail] == [o.timing for o in straight]


def test_a_clocked_run_writes_simulated_time_participation_and_fairness_by_device(tmp_path, local_ray, monkeypatch):
    from fedsim.cli.main import main

    tree = synthetic_tree(tmp_path, "clock", **{"train.eval_every": 1, "logging.wandb.mode": "offline",
                                                "logging.wandb.x_axis": "sim_time", "eval.unseen": 2},
                          system={"devices": {"preset": "mobile"}, "dropout": 0.2, "target_accuracy": [0.05, 1.0]})
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["run", str(write_yaml(tmp_path / "clock.yaml", tree)), "--quiet"]) == 0
    run = tmp_path / "clock"
    rows = read_jsonl(run / "rounds.jsonl")
    ends = [r["sim_time_s"] for r in rows]
    assert ends == sorted(ends) and all(r["sim_start_s"] + r["sim_seconds"] == pytest.approx(r["sim_time_s"]) for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    system = summary["system"]
    assert system["sim_seconds"] == ends[-1] and system["dropouts"] == sum(len(r["dropouts"]) for r in rows)
    reached = system["time_to_accuracy"]["acc"]
    assert reached["0.05"] in ends and reached["1.0"] is None
    kinds = {"high-end", "mid-range", "low-end"}
    assert set(system["by_device"]["acc"]) <= kinds and set(system["by_participation"]["acc"])
    assert summary["unseen"]["clients"] == 2 and summary["seen"]["clients"] == 6
    held_out = {r["client"] for r in read_jsonl(run / "metrics.jsonl") if r.get("unseen")}
    assert len(held_out) == 2 and all(r["times_sampled"] == 0 for r in read_jsonl(run / "metrics.jsonl")
                                      if r["client"] in held_out)
    best = summary["best_round"]["acc"]
    assert best["mean"] == max(r["acc"]["mean"] for r in rows) and best["round"] in range(1, 5)
    from fedsim.metrics.wandb_files import history

    [offline] = (run / "wandb").glob("offline-run-*")
    logged = history(offline)
    assert [h["sim/time_s"] for h in logged if "fairness/acc_mean" in h] == ends
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## On the virtual clock" in text and (tmp_path / "report" / "sim_time.png").stat().st_size > 10_000
    assert f"{ends[-1]:.0f} s simulated" in text and "| clock | initial | device |" in text


@pytest.mark.parametrize("over, message", [
    (["system.devices.speed=-2"], "system.devices.speed: Input should be greater than or equal to 0.000001"),
    (["system.dropout=0.5"], "system.dropout: needs the virtual clock"),
    (["system.devices.preset=uniform", "system.over_selection=-1"], "system.over_selection: Input should be"),
    (["system.devices.trace=/nonexistent/devices.csv"], "system.devices.trace: cannot read /nonexistent/devices.csv"),
    (["logging.wandb.x_axis=sim_time"], "logging.wandb.x_axis: sim_time needs the virtual clock"),
    (["eval.unseen=8"], "eval.unseen: 8 holds out 8 of the 8 clients"),
    (["eval.unseen=1.5"], "eval.unseen: a fraction must be at most 1.0"),
])
def test_hostile_system_settings_are_one_line_exit_2(tmp_path, over, message):
    config = write_yaml(tmp_path / "bad.yaml", synthetic_tree(tmp_path, "bad"))
    out = fedsim_cli("run", str(config), "--dry-run", *over)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_an_edited_device_trace_changes_the_fingerprint_a_resume_checks(tmp_path, data_root):
    from conftest import plan_for

    trace = tmp_path / "devices.csv"
    fingerprints = []
    for speed in (50, 60):
        trace.write_text("client,speed,up_mbps,down_mbps\n" + "".join(f"{c},{speed},5,20\n" for c in range(6)))
        cfg = six_client_run(tmp_path, data_root, "fedper", 2, system={"devices": {"trace": str(trace)}})
        fingerprints.append(plan_for(cfg).fingerprint)
    assert fingerprints[0] != fingerprints[1]


def test_unseen_clients_never_train_and_the_rest_is_bit_identical_on_one_two_and_three_workers(tmp_path, data_root,
                                                                                               monkeypatch):
    runs = []
    for workers, system in ((1, None), (2, None), (3, None), (2, HETEROGENEOUS), (3, HETEROGENEOUS)):
        cfg = six_client_run(tmp_path, data_root, "fedper", workers, ROUNDS, eval_every=1, system=system)
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"unseen": 2})})
        server, outcomes = _rounds(monkeypatch, cfg)
        runs.append(round_records(outcomes))
        unseen = server.plan.population.unseen
        assert len(unseen) == 2 and not any(unseen & set(o.sampled) for o in outcomes)
        assert {r["client"] for o in outcomes for r in o.records if r.get("unseen")} == unseen
        if system is None:
            assert all(len(o.sampled) == 2 for o in outcomes)  # f = 0.5 of the 4 clients that train
    assert runs[0] == runs[1] == runs[2] and runs[3] == runs[4]


FEDBUFF = {"devices": {"preset": "lognormal", "sigma": 1.0}, "dropout": 0.2, "mode": "async", "async_buffer": 2,
           "concurrency": 4}


@pytest.mark.parametrize("algorithm, extra", [("fedavg", {}), ("fedper", {}),
                                             ("fedavg", {"server_momentum": 0.9, "server_lr": 0.7})])
def test_fedbuff_is_bit_identical_on_one_two_and_three_workers_and_after_a_resume(tmp_path, data_root, monkeypatch,
                                                                                  algorithm, extra):
    def config(workers):
        return six_client_run(tmp_path, data_root, algorithm, workers, 4, eval_every=1, system={**FEDBUFF, **extra})

    runs = []
    for workers in (1, 2, 3):
        server, outcomes = _rounds(monkeypatch, config(workers), rounds=4)
        runs.append((round_records(outcomes), [o.timing for o in outcomes], server.state[WEIGHTS]))
    assert runs[0][:2] == runs[1][:2] == runs[2][:2]
    assert np.array_equal(runs[0][2], runs[1][2]) and np.array_equal(runs[0][2], runs[2][2])
    assert any(max(t["staleness"]) > 0 for t in runs[0][1])  # some updates were stale
    first, head = _rounds(monkeypatch, config(2), rounds=2)
    assert first.held.fedbuff.models  # an older model is still held by a client in flight: the checkpoint must carry it
    ckpt = first.checkpoint(str(tmp_path / "run"), 2)
    _, tail = _rounds(monkeypatch, config(3), rounds=4, ckpt=ckpt, first=3)
    assert round_records(head + tail) == runs[0][0]


@pytest.mark.parametrize("weighting, uniform", [(None, True), ("samples", False)])
def test_fedbuffs_step_weighs_reports_equally_unless_told_otherwise(tmp_path, data_root, monkeypatch, weighting,
                                                                    uniform):
    """FedBuff's Algorithm 1 and FLSim's example weigh the K reports equally: system.async_weighting's default, whatever
    train.weighting (samples) says; a synchronous round keeps train.weighting."""
    system = {**FEDBUFF, **({"async_weighting": weighting} if weighting else {})}
    server = in_process_server(six_client_run(tmp_path, data_root, "fedavg", 1, 4, system=system))
    server.restore(None)
    timing = server.plan.timing(1)
    assert timing is not None and timing.versions
    assert server.reduction.scales(list(timing.participants), timing).uniform[WEIGHTS] is uniform
    assert server.cfg.train.weighting == "samples"


def test_the_servers_fedbuff_step_treats_batchnorms_statistics_apart(tmp_path, data_root, monkeypatch):
    """The mask engine/fedbuff.py's step averages instead of stepping, as the server builds it from the model."""
    cfg = six_client_run(tmp_path, data_root, "fedavg", 1, 4, system={**FEDBUFF, "server_lr": 0.7})
    statistics = in_process_server(cfg).held.fedbuff.statistics
    assert statistics.any() and not statistics.all()


def test_fedbuff_refuses_methods_with_server_state_and_buffers_beyond_the_clients(tmp_path, data_root):
    from conftest import plan_for

    from fedsim.errors import ConfigError

    with pytest.raises(ConfigError, match="system.mode: async applies FedBuff's step to the weights alone; scaffold"):
        plan_for(six_client_run(tmp_path, data_root, "scaffold", 1, system=FEDBUFF))
    with pytest.raises(ConfigError, match="system.async_buffer: 9 is more than the 6 clients that train"):
        plan_for(six_client_run(tmp_path, data_root, "fedavg", 1, system={**FEDBUFF, "async_buffer": 9}))
