"""IFCA's defining properties: a client trains (and is scored with) the cluster model with the lowest loss on its
data, the server averages each cluster's returned models apart, and with one cluster it is FedAvg."""
import numpy as np
import pytest
from conftest import plan_for, train_one
from test_algorithms import BN_NET, CLIENT, config, globals_over, runtime, start, started

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.ifca import CLUSTER
from fedsim.core.aggregate import weighted_average
from fedsim.errors import ConfigError


def _trained_on(tmp_path, client: int) -> np.ndarray:
    """A model trained on ``client``'s data for a few epochs: clearly better for it than the round-0 model."""
    rt = runtime(tmp_path, "fedavg", train__local_epochs=3)
    return train_one(rt, start(rt), client, 1)[0][WEIGHTS]


@pytest.mark.parametrize("better", [0, 1])
def test_ifca_client_trains_and_is_scored_with_the_cluster_of_lowest_loss(tmp_path, better):
    rt = runtime(tmp_path, "ifca")
    initial, trained = rt.initial("shared"), _trained_on(tmp_path, CLIENT)
    clusters = np.stack([trained, initial] if better == 0 else [initial, trained])
    uploads, _ = train_one(rt, {"clusters": clusters}, CLIENT, 1)
    assert uploads[CLUSTER].tolist() == [better]
    # It trained from that cluster's model: the same update FedAvg makes from it.
    fedavg = runtime(tmp_path, "fedavg")
    assert np.array_equal(uploads[WEIGHTS], train_one(fedavg, {WEIGHTS: trained}, CLIENT, 1)[0][WEIGHTS])
    # Scored with it too.
    [ifca] = rt.evaluate({"clusters": clusters}, [CLIENT], 1)
    [alone] = fedavg.evaluate({WEIGHTS: trained}, [CLIENT], 1)
    assert ifca["loss"] == alone["loss"] and ifca["acc"] == alone["acc"]


def test_ifca_server_averages_each_cluster_apart_and_keeps_unchosen_ones(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, {"name": "ifca", "clusters": 3}, **BN_NET)
    before = server.state["clusters"].copy()
    seen, hook = [], server.algorithm.server_replies

    def spy(state, replies, num_clients):
        seen.extend(replies)
        hook(state, replies, num_clients)

    server.algorithm.server_replies = spy
    server.round(1)
    chose = {r.client: int(r.uploads[CLUSTER][0]) for r in seen}
    assert len(seen) == 4 and set(chose.values()) != {0, 1, 2}  # 4 clients: some cluster holds two or none
    for c in range(3):
        members = [(r.client, r.n_train, r.uploads[WEIGHTS]) for r in seen if chose[r.client] == c]
        want = weighted_average(members) if members else before[c]
        np.testing.assert_allclose(server.state["clusters"][c], want, rtol=0, atol=1e-7)
        assert members or np.array_equal(server.state["clusters"][c], before[c])
    samples = [sum(r.n_train for r in seen if chose[r.client] == c) for c in range(3)]
    assert np.array_equal(server.state[WEIGHTS], server.state["clusters"][int(np.argmax(samples))])


def test_ifca_clusters_start_as_permuted_draws_of_the_initial_parameters(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, {"name": "ifca", "clusters": 3}, **BN_NET)
    clusters, initial = server.state["clusters"], server.plan.model.initial["shared"]
    assert np.array_equal(clusters[0], initial) and not np.array_equal(clusters[1], clusters[2])
    buffers = server.plan.model.buffers
    for key, _, s, e in server.plan.model.layouts["shared"].spans():
        for c in (1, 2):  # each tensor keeps its values (the initialiser's draw), its statistics untouched
            assert np.array_equal(np.sort(clusters[c, s:e]), np.sort(initial[s:e]))
            assert (key in buffers) == np.array_equal(clusters[c, s:e], initial[s:e]) or len(set(initial[s:e])) == 1
    assert np.array_equal(started(monkeypatch, tmp_path, {"name": "ifca", "clusters": 3}, **BN_NET).state["clusters"],
                          clusters)  # from the seed alone


def test_ifca_with_one_cluster_is_fedavg(tmp_path, monkeypatch):
    fedavg = globals_over(started(monkeypatch, tmp_path, "fedavg"), 2)
    ifca = globals_over(started(monkeypatch, tmp_path, {"name": "ifca", "clusters": 1}), 2)
    # The same local updates; FedAvg's exact fixed-point mean (a quantum per tensor) and IFCA's float64 mean (the
    # engine's reference) agree to float32 rounding, not bit for bit (1.5e-8 apart at most here); round 2 trains
    # from them.
    np.testing.assert_allclose(fedavg[0], ifca[0], rtol=0, atol=1e-7)
    np.testing.assert_allclose(fedavg[1], ifca[1], rtol=0, atol=1e-6)


def test_ifca_refuses_more_clusters_than_clients(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.clusters: 9 clusters for 8 clients"):
        plan_for(config(tmp_path, {"name": "ifca", "clusters": 9}))
