"""FedFomo's defining properties: a client weighs each downloaded model by its loss drop per parameter distance on
held-out data, w_ij = (L_i(theta_i) - L_i(theta_j)) / ||theta_j - theta_i||, moves by the clipped, normalised
weights, and the server keeps each reply's model and adds its weights to the affinity P, from which the next
downloads are chosen (epsilon-greedy)."""
import numpy as np
import pytest
import torch
from conftest import plan_for, train_one
from test_algorithms import BN_NET, CLIENT, config, runtime, started

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.fedfomo import AFFINITY, IDS, MODEL, combined, validation_split
from fedsim.errors import ConfigError


def _parameters(plan) -> np.ndarray:
    """Where the shared vector holds parameters, from the model plan (not the method's own mask)."""
    return np.concatenate([np.full(end - start, key not in plan.model.buffers)
                           for key, _, start, end in plan.model.layouts["shared"].spans()])


def _held_out_loss(rt, model: np.ndarray) -> float:
    x, y = rt.client_tensors(CLIENT, "train")
    held = torch.as_tensor(validation_split(len(y), 0.2)[1])
    rt.layouts["shared"].load(model)
    return rt.score(x[held], y[held])[0]


def test_fedfomo_weighs_each_model_by_its_loss_drop_per_distance(tmp_path):
    rt = runtime(tmp_path, "fedfomo", **BN_NET)  # BatchNorm: statistics left out of the distance
    own = rt.initial("shared")
    helper = runtime(tmp_path, "fedavg", train__local_epochs=3, **BN_NET)
    good = train_one(helper, {WEIGHTS: own}, CLIENT, 1)[0][WEIGHTS]  # trained on the client's own data
    bad = (own * 4).astype(np.float32)  # the same network, blown up: a higher loss
    models = np.stack([good, bad, own])
    uploads, _ = train_one(rt, {"models": models, IDS: np.array([5, 3, 7])}, CLIENT, 1)
    mask, base = _parameters(rt.plan), _held_out_loss(rt, own)
    want = [(base - _held_out_loss(rt, m)) / np.linalg.norm((m.astype(np.float64) - own)[mask]) for m in models[:2]]
    np.testing.assert_allclose(uploads[AFFINITY][:2], want, rtol=1e-5)
    assert uploads[AFFINITY][0] > 0 > uploads[AFFINITY][1] and uploads[AFFINITY][2] == 0  # 0: the same model
    assert uploads[IDS].tolist() == [5, 3, 7]
    # Only the good model has a positive weight, so the client moved onto it before training: FedFomo's update is
    # then the same local update FedAvg makes from it, on the training split.
    assert np.array_equal(combined(own, models, uploads[AFFINITY].astype(np.float64)), good)
    assert np.array_equal(rt.slots[MODEL][CLIENT], uploads[WEIGHTS])


def test_fedfomo_update_clips_negative_weights_and_normalises():
    own, a, b = np.zeros(3, np.float32), np.array([4, 0, 0], np.float32), np.array([0, 8, 0], np.float32)
    np.testing.assert_array_equal(combined(own, np.stack([a, b]), np.array([1.0, 3.0])), [1, 6, 0])
    np.testing.assert_array_equal(combined(own, np.stack([a, b]), np.array([-5.0, 2.0])), b)
    assert combined(own, np.stack([a, b]), np.array([-1.0, 0.0])) is own  # nothing helps: its own model


def test_fedfomo_validation_split_is_fixed_spread_and_disjoint():
    train, held = validation_split(10, 0.2)
    assert held.tolist() == [0, 5] and sorted(train.tolist() + held.tolist()) == list(range(10))
    assert validation_split(3, 0.2)[1].tolist() == [0]  # at least one held out, one left to train on


def test_fedfomo_server_keeps_each_reply_and_adds_its_weights_to_the_affinity(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedfomo")
    first = server.round(1).sampled  # every download is still a round-0 model: weight 0, P unchanged
    assert not server.state["affinity"].any()
    models, affinity = server.state["models"].copy(), server.state["affinity"].copy()
    seen, hook = [], server.algorithm.server_replies

    def spy(state, replies, num_clients):
        seen.extend(replies)
        hook(state, replies, num_clients)

    server.algorithm.server_replies = spy
    sampled = server.round(2).sampled
    assert [r.client for r in seen] == sampled
    for r in seen:
        models[r.client] = r.uploads[WEIGHTS]
        affinity[r.client, r.uploads[IDS].astype(int)] += r.uploads[AFFINITY]
    assert np.array_equal(server.state["models"], models)
    assert len({row.tobytes() for row in models}) == 1 + len(set(first) | set(sampled))  # the rest: round 0's
    assert np.array_equal(server.state["affinity"], affinity) and np.abs(affinity).max() > 0
    assert server.state["exploration"].tolist() == [server.cfg.seed, 2]


def test_fedfomo_downloads_follow_the_affinity_greedily_and_deterministically(tmp_path, monkeypatch):
    greedy = started(monkeypatch, tmp_path, {"name": "fedfomo", "epsilon": 0.0, "models_to_download": 3})
    state = dict(greedy.state)
    state["affinity"] = np.zeros((8, 8))
    state["affinity"][2] = [0.5, 0.1, 9, 0.7, 0.1, 0.9, 0.2, 0.3]  # its own entry, however high, is never chosen
    assert greedy.algorithm.downloads(state, 2).tolist() == [5, 3, 0]
    groups = greedy.algorithm.broadcast_groups(state, [2, 4], training=True)
    assert [members for members, _ in groups] == [[2], [4]]
    assert np.array_equal(groups[0][1]["models"], state["models"][[5, 3, 0]])
    assert greedy.algorithm.broadcast_groups(state, [2, 4], training=False) == [([2, 4], {})]
    # Exploration: random picks drawn from (seed, server updates, client) alone; epsilon decays per update.
    explorer = started(monkeypatch, tmp_path, {"name": "fedfomo", "epsilon": 1.0, "epsilon_decay": 0.5,
                                                "models_to_download": 3}).algorithm
    picks = [explorer.downloads(state, 2).tolist() for _ in range(2)]
    assert picks[0] == picks[1] and 2 not in picks[0] and len(set(picks[0])) == 3
    assert picks[0] != [5, 3, 0]  # not the greedy choice (for this seed)
    state["exploration"] = np.array([state["exploration"][0], 2])  # epsilon 1 - 2 x 0.5 = 0: greedy again
    assert explorer.downloads(state, 2).tolist() == [5, 3, 0]


def test_fedfomo_refuses_more_downloads_than_other_clients(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.models_to_download: 8 other clients' models for 8 clients"):
        plan_for(config(tmp_path, {"name": "fedfomo", "models_to_download": 8}))
