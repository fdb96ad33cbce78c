"""FedAMP's defining properties: each client trains from its own attention-weighted sum of the clients' models the
server keeps (xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma over the parameters, xi_ii = 1 - the rest), and
the server keeps each reply's model in the client's row."""
import numpy as np
from test_algorithms import BN_NET, owner, started

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.fedamp import MODELS

# xi well inside (0, 1) for the MLP's distances: 7 others at most alpha_k / sigma = 0.05 each, so xi_ii >= 0.65 and the
# clamp (others' weights scaled to sum to 1) never acts.
PARAMS = {"name": "fedamp", "alpha_k": 0.1, "sigma": 2.0}


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


def test_fedamp_self_weight_is_never_negative(tmp_path, monkeypatch):
    """With alpha_k / sigma so large that the others' weights would sum past 1 (xi_ii < 0: u_i an extrapolation away
    from the client's own model), they are scaled to sum to 1 and xi_ii is 0; the server records the self-weights."""
    server = started(monkeypatch, tmp_path, {"name": "fedamp", "alpha_k": 5.0, "sigma": 2.0}, train__rounds=1)
    rng = np.random.default_rng(0)
    models = (server.state[MODELS] + rng.normal(0, 1e-3, server.state[MODELS].shape)).astype(np.float32)  # close
    xi = server.algorithm.attention(models, 0)
    assert xi[0] == 0 and (xi >= 0).all() and abs(xi.sum() - 1) < 1e-12
    unscaled = 5.0 * np.exp(-np.array([np.sum((models[j] - models[0]).astype(np.float64)[server.algorithm.parameter_mask]
                                                      ** 2) for j in range(1, len(models))]) / 2.0) / 2.0
    np.testing.assert_allclose(xi[1:], unscaled / unscaled.sum(), rtol=1e-9)  # the attention's proportions stay
    recorded = server.round(1).mechanism
    assert recorded["fedamp_self_weight_min"] >= 0 and recorded["fedamp_self_weight_mean"] < 1
