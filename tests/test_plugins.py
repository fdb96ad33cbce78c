"""A user's algorithm, model, data set and partition, each named in a config as ``module:name``."""
import numpy as np
import pytest
from conftest import in_process_server

from fedsim.algorithms import WEIGHTS
from fedsim.config import ConfigError, validate
from fedsim.data import DataError, load_dataset, make_partition
from fedsim.engine.simulation import prepare_inputs


def _config(tmp_path, **over):
    tree = {"name": "plug", "seed": 2, "out_dir": str(tmp_path), "algorithm": "user_plugins:HalfStep",
            "data": {"dataset": "user_plugins:blobs", "partition": "user_plugins:round_robin", "num_clients": 4,
                     "augment": False},
            "model": {"name": "user_plugins:tiny_net"},
            "train": {"rounds": 2, "local_epochs": 1, "batch_size": 20, "eval_every": 1},
            "eval": {"finetune_epochs": 0}, "engine": {"workers": 2}}
    tree.update(over)
    return validate(tree)


def test_a_users_algorithm_model_dataset_and_partition_run_unchanged_fedsim(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    data, partition, _ = prepare_inputs(cfg)  # validation path of `fedsim run`
    assert data.name == "blobs" and [len(t) for t in partition.train] == [100] * 4
    assert partition.train[1][:3].tolist() == [1, 5, 9]  # the user's round-robin split
    server = in_process_server(monkeypatch, cfg, partition, data)
    server.restore(None)
    before = server.state[WEIGHTS].copy()
    result = server.round(1)
    assert [r["client"] for r in result.records] == [0, 1, 2, 3] and all(0 <= r["acc"] <= 1 for r in result.records)
    # HalfStep's own server hook: the new global is halfway between the old one and the average.
    updates = [u for w in server.workers for u in w.runtime.train({WEIGHTS: before}, result.sampled, 1)]
    average = np.mean([u.uploads[WEIGHTS] for u in updates], axis=0)
    np.testing.assert_allclose(server.state[WEIGHTS], (before + average) / 2, rtol=1e-5, atol=1e-6)


def test_plugins_that_cannot_be_imported_or_are_the_wrong_kind_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.name: cannot import 'nowhere:Thing'"):
        _config(tmp_path, algorithm="nowhere:Thing")
    with pytest.raises(ConfigError, match="not a subclass of fedsim.algorithms.Algorithm"):
        _config(tmp_path, algorithm="user_plugins:tiny_net")
    with pytest.raises(DataError, match="data.dataset: cannot import"):
        load_dataset("user_plugins:nothing")
    with pytest.raises(DataError, match="data.partition: cannot import"):
        make_partition("user_plugins:nothing", np.zeros(4, int), np.zeros(4, int), 2, 0)
    with pytest.raises(ConfigError, match="model.name"):
        prepare_inputs(_config(tmp_path, model={"name": "user_plugins:blobs"}))


def test_a_run_starts_from_another_runs_final_global_weights(tmp_path, monkeypatch):
    """LG-FedAvg warm-started from a FedAvg run, as the FedBABU authors' scripts do (model.init_from)."""
    from fedsim.engine.simulation import save_final_model

    fedavg = _config(tmp_path, name="avg", algorithm="fedavg")
    data, partition, _ = prepare_inputs(fedavg)
    server = in_process_server(monkeypatch, fedavg, partition, data)
    server.restore(None)
    server.round(1)
    (tmp_path / "avg").mkdir()
    save_final_model(tmp_path / "avg", fedavg, data, server.state[WEIGHTS])

    lg = _config(tmp_path, name="lg", algorithm="lg_fedavg", model={"name": "user_plugins:tiny_net",
                                                                     "init_from": str(tmp_path / "avg")})
    _, _, init = prepare_inputs(lg)
    warm = in_process_server(monkeypatch, lg, partition, data, init)
    runtime = warm.workers[0].runtime
    assert np.array_equal(runtime.initial["full"], server.state[WEIGHTS])  # every weight, body and head
    assert runtime.layouts["personal"].size and runtime.layouts["shared"].size  # LG: body personal, head shared
    with pytest.raises(ConfigError, match="model.init_from: cannot read"):
        prepare_inputs(_config(tmp_path, model={"name": "user_plugins:tiny_net", "init_from": str(tmp_path)}))
    with pytest.raises(ConfigError, match="model.init_from: weight"):
        prepare_inputs(_config(tmp_path, model={"name": "mlp", "init_from": str(tmp_path / "avg")}))


def test_clients_never_sampled_are_reported_as_such(tmp_path, monkeypatch):
    cfg = _config(tmp_path, train={"rounds": 2, "local_epochs": 1, "batch_size": 20, "fraction": 0.25})
    data, partition, _ = prepare_inputs(cfg)
    server = in_process_server(monkeypatch, cfg, partition, data)
    server.restore(None)
    result = server.round(1)
    counts = {r["client"]: r["times_sampled"] for r in result.records}
    assert counts == {c: int(c in result.sampled) for c in range(4)} and sum(counts.values()) == 1
