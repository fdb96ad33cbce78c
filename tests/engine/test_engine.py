"""End-to-end engine tests on a real CIFAR-10 subset (FEDSIM_DATA)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import per_client, plan_for, small_config, train_one

from fedsim.algorithms import WEIGHTS
from fedsim.client.runtime import ClientRuntime
from fedsim.engine.server import Server
from fedsim.errors import ConfigError
from fedsim.metrics.logger import read_jsonl
from fedsim.simulate import run


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_scaffold_on_one_worker_matches_three_ray_workers(tmp_path, data_root, local_ray, backend):
    # Client and server control variates, owned by workers and checkpointed every round; three real actors against
    # one actor or the local backend's worker in this process.
    over = dict(algorithm="scaffold", train__fraction=0.6, engine__cpus_per_worker=0.5)
    one = run(small_config(tmp_path, data_root, name="s1", engine__workers=1, engine__backend=backend, **over))
    three = run(small_config(tmp_path, data_root, name="s3", engine__workers=3, **over))
    a, b = per_client(one.run_dir), per_client(three.run_dir)
    assert len(a) == 2 * 5 and a == b  # every float, bit for bit (test_workers.py: every method, in-process workers)
    assert len({w["pid"] for w in three.summary["workers"]} | {w["pid"] for w in one.summary["workers"]}) == 4


def test_run_folder_contents(tmp_path, data_root, local_ray):
    res = run(small_config(tmp_path, data_root, name="files", train__rounds=1))
    for name in ("config.yaml", "partition.npz", "partition_stats.json", "metrics.jsonl", "rounds.jsonl", "summary.json"):
        assert (res.run_dir / name).is_file(), name
    rec = per_client(res.run_dir)[0]
    assert set(rec) >= {"round", "client", "n_train", "n_test", "loss", "acc"}
    (row,) = read_jsonl(res.run_dir / "rounds.jsonl")
    assert row["cpu_seconds"] > 0  # the workers' training and evaluation, and the server's own share
    assert set(res.summary["acc"]) >= {"mean", "std", "min"}
    with pytest.raises(ConfigError, match="already exists"):
        run(small_config(tmp_path, data_root, name="files", train__rounds=1))


def _runtime(tmp_path, data_root, algorithm, **over):
    plan = plan_for(small_config(tmp_path, data_root, algorithm=algorithm, **over))
    return ClientRuntime(plan, dict(enumerate(plan.clients)))


def test_fedper_never_sends_personal_layers(tmp_path, data_root):
    rt = _runtime(tmp_path, data_root, "fedper")
    shared, personal = rt.layouts["shared"], rt.layouts["personal"]
    assert all(k.startswith("classifier.") for k in personal.keys)
    assert not set(shared.keys) & set(personal.keys)
    uploads, _ = train_one(rt, {WEIGHTS: shared.pack()}, 3, round_idx=1)
    assert uploads[WEIGHTS].shape == (shared.size,)
    # The head that trained stays on the worker, and it really changed there.
    assert not np.array_equal(rt.slots["personal"][3], rt.initial("personal"))
    assert personal.size == 64 * 2 * 2 * 10 + 10  # exactly Linear(256, 10)


def test_fedavg_shares_everything_and_local_shares_nothing(tmp_path, data_root):
    fedavg = _runtime(tmp_path, data_root, "fedavg")
    assert fedavg.layouts["personal"].size == 0
    train_one(fedavg, {WEIGHTS: fedavg.layouts["shared"].pack()}, 0, round_idx=1)
    assert len(fedavg.slots["personal"]) == 0  # nothing personal is kept, so nothing is checkpointed per client
    local = _runtime(tmp_path, data_root, "local")
    assert local.layouts["shared"].size == 0
    uploads, _ = train_one(local, {WEIGHTS: np.empty(0, np.float32)}, 0, round_idx=1)
    assert uploads[WEIGHTS].size == 0


@pytest.mark.slow
def test_fedper_beats_fedavg_at_k2(tmp_path, data_root, local_ray):
    over = dict(train__rounds=4, train__local_epochs=2, data__train_fraction=0.05, data__test_fraction=0.2)
    fedavg = run(small_config(tmp_path, data_root, name="avg", algorithm="fedavg", **over))
    fedper = run(small_config(tmp_path, data_root, name="per", algorithm="fedper", **over))
    gap = fedper.summary["acc"]["mean"] - fedavg.summary["acc"]["mean"]
    assert gap > 0.10, (fedper.summary["acc"], fedavg.summary["acc"])


def test_stateless_algorithms_balance_each_round_and_match_one_worker(tmp_path, data_root, local_ray):
    # FedAvg keeps nothing on clients, so every round's sample is split afresh by SGD steps.
    server = Server.__new__(Server)
    server.plan, server.pool = SimpleNamespace(fixed_owners=False), [None, None]  # two workers
    split = server._by_worker([0, 2, 4, 6], [9, 0, 3, 0, 3, 0, 3])  # costs by client id
    assert split == {0: [0], 1: [2, 4, 6]}
    one = run(small_config(tmp_path, data_root, name="avg1", algorithm="fedavg", engine__workers=1, train__fraction=0.6))
    two = run(small_config(tmp_path, data_root, name="avg2", algorithm="fedavg", engine__workers=2, train__fraction=0.6))
    assert per_client(one.run_dir) == per_client(two.run_dir)
    # Logs are in client order too, however the round was split.
    assert (one.run_dir / "comm.jsonl").read_text() == (two.run_dir / "comm.jsonl").read_text()


def test_memory_format_changes_speed_not_what_is_learned(tmp_path, data_root):
    # channels_last and contiguous run different kernels; packed vectors are read in logical order,
    # so the same client's update agrees to rounding, and a mix-up of layouts would not.
    runtimes = {fmt: _runtime(tmp_path, data_root, "fedper", engine__memory_format=fmt)
                for fmt in ("channels_last", "contiguous")}
    conv = next(p for p in runtimes["channels_last"].net.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert all(p.is_contiguous() for p in runtimes["contiguous"].net.parameters())
    g = runtimes["contiguous"].layouts["shared"].pack()
    assert np.array_equal(g, runtimes["channels_last"].layouts["shared"].pack())
    a, b = (train_one(rt, {WEIGHTS: g}, 0, round_idx=1)[0][WEIGHTS] for rt in runtimes.values())
    assert not np.array_equal(a, g)
    # Rounding differences grow over the steps (measured: mean 1e-5 against a mean update of 2e-3).
    assert np.abs(a - b).mean() < 0.05 * np.abs(a - g).mean()
    heads = [rt.slots["personal"][0] for rt in runtimes.values()]
    initial = runtimes["contiguous"].initial("personal")
    assert np.abs(heads[0] - heads[1]).mean() < 0.05 * np.abs(heads[0] - initial).mean()
