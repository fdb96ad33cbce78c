"""`fedsim run --dry-run`: exact work counts, nothing written, no Ray; every shipped config passes it."""
import math
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TESTS, in_process_server, six_client_run, small_config, small_tree, synthetic_tree, write_yaml

REPO = TESTS.parent
SHIPPED = sorted([*(REPO / "experiments").rglob("*.yaml"), *(REPO / "fedsim" / "reproduce" / "configs").rglob("*.yaml")])

# FedBABU's 4-conv CNN on 3x32x32 inputs, 10 classes, counted by hand: four 3x3 convs of 64 filters with
# biases, four BatchNorms (64 weights + 64 biases), a 256 -> 10 classifier.
CNN4_PARAMETERS = (3 * 64 * 9 + 64) + 3 * (64 * 64 * 9 + 64) + 4 * 128 + (256 * 10 + 10)
CNN4_BN_BUFFER_VALUES = 4 * 2 * 64  # running mean and variance
CNN4_BN_COUNTERS = 4  # num_batches_tracked, int64


def _sizes(cfg) -> tuple[list[int], list[int]]:
    from fedsim.data import load_dataset, make_partition

    d = cfg.data
    data = load_dataset(d.dataset, d.root)
    part = make_partition(d.partition.name, data.train_y, data.test_y, d.num_clients, cfg.seed,
                          train_fraction=d.train_fraction, test_fraction=d.test_fraction, **d.partition.arguments())
    return [len(t) for t in part.train], [len(t) for t in part.test]


def test_counts_equal_hand_computation(tmp_path, data_root):
    from fedsim.engine.estimate import estimate

    cfg = small_config(tmp_path, data_root, train__rounds=3, train__local_epochs=2, train__batch_size=7,
                       train__eval_every=2, eval__finetune_epochs=3, eval__finetune_batch_size=5,
                       engine__workers=8, engine__cpus_per_worker=0.5, engine__gpus_per_worker=0.25)
    train, test = _sizes(cfg)
    e = estimate(cfg)
    assert e.parameters == CNN4_PARAMETERS == 115_658
    assert e.model_bytes == 4 * (CNN4_PARAMETERS + CNN4_BN_BUFFER_VALUES) + 8 * CNN4_BN_COUNTERS
    # FedPer, K_P = 1: everything but the classifier is shared, BN statistics and counters included.
    assert e.shared_values == CNN4_PARAMETERS + CNN4_BN_BUFFER_VALUES + CNN4_BN_COUNTERS - (256 * 10 + 10)
    assert (e.clients, e.sampled_per_round, e.rounds, e.epochs_per_round) == (5, 5, 3, 2)
    assert e.train_sample_steps == 3 * 2 * sum(train)
    assert e.train_sgd_steps == 3 * 2 * sum(math.ceil(n / 7) for n in train)
    # Evaluation at rounds 2 and 3 (the final one), every client, fine-tuned 3 epochs at batch 5.
    assert e.evaluation_rounds == 2
    assert e.finetune_sample_steps == 2 * 3 * sum(train)
    assert e.finetune_sgd_steps == 2 * 3 * sum(math.ceil(n / 5) for n in train)
    assert e.scored_test_images == 2 * 2 * sum(test)
    # Five uploads and five broadcasts of a float32 vector: 4 bytes a value plus a pickle header.
    assert 5 * 4 * e.shared_values < e.bytes_up_per_round == e.bytes_down_per_round < 5 * (4 * e.shared_values + 200)
    assert (e.workers, e.cpus_per_worker, e.gpus_per_worker) == (5, 0.5, 0.25)  # never more workers than clients


@pytest.mark.parametrize("threads, workers, at_once", [(1, 2, 2), (1, 64, None), (2, 2, None)])
def test_the_time_is_the_work_at_the_timed_rate_over_the_workers_the_cores_hold(tmp_path, data_root, monkeypatch,
                                                                             threads, workers, at_once):
    from fedsim.engine.estimate import estimate

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)  # a 2-core machine
    cfg = small_config(tmp_path, data_root, engine__workers=workers, engine__threads_per_worker=threads)
    e = estimate(cfg, timer=lambda plan: 100.0)
    assert e.at_once == (at_once or 2 // threads)  # never more than the cores hold at each worker's threads
    assert e.seconds == pytest.approx((e.train_sample_steps + e.finetune_sample_steps) / (100.0 * e.at_once))
    assert estimate(cfg).seconds is None  # nothing timed, no time claimed


def test_a_run_on_gpus_is_not_timed_on_this_cpu(tmp_path, data_root):
    """A paper-scale model's few steps on a CPU took over 10 minutes, and a GPU's rate is not the CPU's."""
    from fedsim.engine.estimate import describe, estimate

    e = estimate(small_config(tmp_path, data_root, engine__gpus_per_worker=0.25),
                 timer=lambda plan: pytest.fail("timed on the CPU"))
    assert e.seconds is None and "time not estimated: its workers train on GPUs" in describe(e)


def test_own_update_personalization_counts_the_methods_epochs_at_the_training_batch(tmp_path, data_root):
    from fedsim.engine.estimate import estimate

    cfg = small_config(tmp_path, data_root, algorithm={"name": "fedrep", "head_epochs": 3, "body_epochs": 1},
                       train__rounds=2, train__batch_size=7, train__eval_every=2, eval={"personalize": "own_update"})
    train, _ = _sizes(cfg)
    e = estimate(cfg)
    assert e.epochs_per_round == 4 and e.evaluation_rounds == 1
    assert e.finetune_sample_steps == 4 * sum(train)  # FedRep's head and body epochs, not eval.finetune_epochs
    assert e.finetune_sgd_steps == 4 * sum(math.ceil(n / 7) for n in train)


def test_counts_equal_what_the_server_runs(tmp_path, data_root, monkeypatch):
    """Sampling (f = 0.5), the method's own epochs (FedRep: head + body) and traffic as the real server
    accounts them, round by round."""
    from fedsim.engine.estimate import estimate

    cfg = six_client_run(tmp_path, data_root, "fedrep", workers=2, rounds=2)
    e = estimate(cfg)
    server = in_process_server(cfg)
    outcomes = [server.round(r) for r in (1, 2)]
    epochs = cfg.algorithm.params["head_epochs"] + cfg.algorithm.params["body_epochs"]
    assert e.epochs_per_round == epochs
    assert all(len(o.sampled) == e.sampled_per_round == 3 for o in outcomes)
    assert e.train_sample_steps == sum(server.plan.train_sizes[c] * epochs for o in outcomes for c in o.sampled)
    for o in outcomes:
        assert sum(c["bytes_up"] for c in o.comm) == e.bytes_up_per_round
        assert sum(c["bytes_down"] for c in o.comm) == e.bytes_down_per_round
    assert e.finetune_sample_steps == sum(r["n_train"] for r in outcomes[-1].records) * cfg.eval.finetune_epochs


def _write(tmp_path, tree: dict) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_cli_dry_run_writes_nothing_and_starts_no_ray(tmp_path, data_root, capsys, no_ray):
    from fedsim.cli.main import main

    out_dir = tmp_path / "runs"
    tree = small_tree(out_dir, data_root, sweep={"algorithm": ["fedavg", "fedper"]})
    assert main(["run", str(_write(tmp_path, tree)), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "t-fedavg: ok" in printed and "t-fedper: ok" in printed and "sample-steps" in printed
    assert printed.count("  time         about ") == 2 and "time: about" in printed  # each run's, then the two's
    assert not out_dir.exists()
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


def test_cli_dry_run_bad_config_is_one_line_exit_2(tmp_path, data_root, capsys):
    from fedsim.cli.main import main

    tree = small_tree(tmp_path / "runs", data_root)
    assert main(["run", str(_write(tmp_path, tree)), "--dry-run", "train.rounds=0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.rounds" in err
    assert not (tmp_path / "runs").exists()


def test_cli_dry_run_says_in_one_line_that_pfedme_clamps_its_step(tmp_path, data_root, capsys):
    from fedsim.cli.main import main

    tree = small_tree(tmp_path / "runs", data_root)
    assert main(["run", str(_write(tmp_path, tree)), "--dry-run", "algorithm=pfedme", "train.body.lr=0.1",
                 "train.head.lr=0.1"]) == 0
    method = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("method")]
    assert len(method) == 1 and "lr 0.1 x lambda 15 = 1.5" in method[0] and "step_limit 0.15" in method[0]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_dry_runs(path, data_root, monkeypatch, tmp_path, capsys):
    """Each sweep variant validates, partitions and builds its model (paper scale included: no training)."""
    from fedsim.cli.main import main

    monkeypatch.chdir(tmp_path)  # a relative out_dir would land here: the check below sees it
    if "paper" in path.parts:
        # A paper-scale model's steps (the time estimate's and the rehearsal's) take minutes on a CPU; this test builds
        # its model without training, as its docstring says, and the rehearsal's own tests train small ones.
        monkeypatch.setattr("fedsim.client.rehearsal.throughput", lambda plan: None)
        monkeypatch.setattr("fedsim.client.rehearsal.rehearse", lambda plan: None)
    assert main(["run", str(path), "--dry-run"]) == 0, capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_dry_run_prints_the_noise_multiplier_q_delta_and_final_epsilon_and_refuses_a_run_past_its_budget(
        tmp_path, capsys):
    from fedsim.cli.main import main

    tree = {**synthetic_tree(tmp_path, algorithm="fedavg", **{"train.sampling": "poisson", "train.fraction": 0.25,
                                                              "train.weighting": "uniform"}),
            "privacy": {"noise_multiplier": 1.0}}
    config = write_yaml(tmp_path / "dp.yaml", tree)
    assert main(["run", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "drawn in round 1 (Poisson: each client with probability f)" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("privacy"))
    assert line.strip().startswith("privacy      central DP, noise multiplier 1, poisson sampling q=0.25 of 8 "
                                   "clients, delta=1e-05 (min(1e-5, 1/N²)), rdp: epsilon ")
    assert line.endswith("after round 4")
    assert main(["run", str(config), "--dry-run", "privacy.delta=-1"]) == 2
    assert capsys.readouterr().err.strip() == "fedsim: error: privacy.delta: Input should be greater than 0 (got -1)"
    assert main(["run", str(config), "--dry-run", "privacy.target_epsilon=0.3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedsim: error: privacy.target_epsilon: epsilon would pass 0.3 at "
                                               "round ") and "raise privacy.noise_multiplier" in err[0]
