"""FedAMP's defining properties: each client trains from its own attention-weighted sum of the clients' models the
server keeps (xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma over the parameters, xi_ii = 1 - the rest), and
the server keeps each reply's model in the client's row."""
import numpy as np
from test_algorithms import BN_NET, owner, started

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.fedamp import MODELS

PARAMS = {"name": "fedamp", "alpha_k": 0.5, "sigma": 2.0}  # xi well inside (0, 1) for the MLP's distances


def _parameters(plan) -> np.ndarray:
    """Where the shared vector holds parameters, from the model plan (not the method's own mask)."""
    return np.concatenate([np.full(end - start, key not in plan.model.buffers)
                           for key, _, start, end in plan.model.layouts["shared"].spans()])


def _by_hand(models: np.ndarray, mask: np.ndarray, i: int, alpha: float, sigma: float) -> np.ndarray:
    w = models.astype(np.float64)
    xi = np.array([alpha * np.exp(-np.sum((w[i, mask] - w[j, mask]) ** 2) / sigma) / sigma for j in range(len(w))])
    xi[i] = 1 - (xi.sum() - xi[i])
    return xi @ w


def test_fedamp_client_trains_from_its_attention_weighted_sum_of_the_server_models(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, PARAMS, train__rounds=2, **BN_NET)  # BatchNorm: statistics to leave out
    server.round(1)
    assert server.broadcast_ref is None  # each client's own object is sent; no unread round broadcast in the store
    models = server.state[MODELS].copy()
    assert len({row.tobytes() for row in models}) > 2  # trained clients moved apart: the weights differ
    received = {}
    anchor = server.algorithm.penalty

    def spy(ctx):  # called after loading what the client received: the anchor of its proximal pull
        received[ctx.client] = ctx.pack("shared")
        return anchor(ctx)

    monkeypatch.setattr(server.algorithm, "penalty", spy)
    sampled = server.round(2).sampled
    mask = _parameters(server.plan)
    floats = np.concatenate([np.full(end - start, not key.endswith("num_batches_tracked"))  # an integer in the model
                             for key, _, start, end in server.plan.model.layouts["shared"].spans()])
    for client in sampled:
        want = _by_hand(models, mask, client, PARAMS["alpha_k"], PARAMS["sigma"])
        np.testing.assert_allclose(received[client][floats], want[floats], rtol=1e-6, atol=1e-6)
        assert not np.allclose(want, models[client], rtol=0, atol=1e-4)  # the others' models do enter u_i


def test_fedamp_attention_sums_to_one_and_favours_the_closer_model(tmp_path, monkeypatch):
    algorithm = started(monkeypatch, tmp_path, PARAMS).algorithm
    size = algorithm.parameter_mask.size
    rng = np.random.default_rng(0)
    models = np.stack([rng.normal(0, 1, size)] * 4).astype(np.float32)
    models[1] = models[0]  # the same model as client 0
    models[2] += rng.normal(0, 0.02, size).astype(np.float32)  # close to it
    models[3] += rng.normal(0, 1, size).astype(np.float32)  # far from it
    xi = algorithm.attention(models, 0)
    assert abs(xi.sum() - 1) < 1e-12
    assert xi[1] == PARAMS["alpha_k"] / PARAMS["sigma"]  # A'(0) = 1/sigma
    assert xi[1] > xi[2] > xi[3] >= 0
    u = algorithm.aggregate(models, 0)
    np.testing.assert_allclose(u, xi @ models.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_fedamp_server_keeps_each_reply_in_its_row_and_scores_clients_with_their_own_model(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, PARAMS)
    before = server.state[MODELS].copy()
    seen, fold = [], server.algorithm.server_replies

    def spy(state, replies, num_clients):
        seen.extend(replies)
        fold(state, replies, num_clients)

    monkeypatch.setattr(server.algorithm, "server_replies", spy)
    sampled = server.round(1).sampled
    after = server.state[MODELS]
    assert [r.client for r in seen] == sorted(sampled)
    for reply in seen:
        assert np.array_equal(after[reply.client], reply.uploads[WEIGHTS])
        assert np.array_equal(owner(server, reply.client).slots["personal_model"][reply.client],
                              reply.uploads[WEIGHTS])  # the MLP has no personal part: shared = full
    others = [c for c in range(len(before)) if c not in sampled]
    assert others and np.array_equal(after[others], before[others])
    np.testing.assert_allclose(server.state[WEIGHTS], after.astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-7)
