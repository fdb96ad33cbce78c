"""FedProto's defining properties: clients upload per-class mean representations (no weights), the server's
prototype of a class is the count-weighted mean of the clients' prototypes of it, and a client's loss pulls its
representations toward the global prototypes."""
import numpy as np
import pytest
import torch
from conftest import train_one
from test_algorithms import CLIENT, runtime, started

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.context import ClientContext
from fedsim.algorithms.fedproto import COUNTS, PROTOTYPES
from fedsim.core.protocol import payload_bytes


def _shape(rt) -> tuple[int, int]:
    return rt.output_layer.out_features, rt.output_layer.in_features


def test_server_prototype_is_the_count_weighted_mean_of_the_clients_and_no_weights_reach_it(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedproto", train__rounds=1)
    seen, hook = [], server.algorithm.server_replies
    server.algorithm.server_replies = lambda state, replies, n: (seen.extend(replies), hook(state, replies, n))
    result = server.round(1)
    classes, dim = server.algorithm.prototype_shape
    assert server.state[WEIGHTS].size == 0 and len(seen) == len(result.sampled)
    for reply in seen:  # prototypes and counts, nothing of the model
        assert set(reply.uploads) == {PROTOTYPES, COUNTS}
        assert reply.uploads[PROTOTYPES].shape == (classes, dim) and reply.uploads[COUNTS].shape == (classes,)
    assert {c["bytes_up"] for c in result.comm} == {payload_bytes(classes * dim) + payload_bytes(classes)}
    counts = np.array([r.uploads[COUNTS] for r in seen], np.float64)
    assert (counts == 0).any() and len({tuple(row) for row in counts}) > 1  # clients lacking classes, skewed ones
    for c in range(classes):
        holders = [(r.uploads[COUNTS][c], r.uploads[PROTOTYPES][c].astype(np.float64)) for r in seen
                   if r.uploads[COUNTS][c] > 0]
        if not holders:
            assert server.state[COUNTS][c] == 0 and not server.state[PROTOTYPES][c].any()
            continue
        weighted = sum(n * p for n, p in holders) / sum(n for n, _ in holders)
        np.testing.assert_allclose(server.state[PROTOTYPES][c], weighted, rtol=1e-6, atol=1e-6)
        assert server.state[COUNTS][c] == sum(n for n, _ in holders)
    # weighting=uniform (the authors' code, PFLlib): each holder of a class once, which is another mean here.
    server.algorithm.params.weighting = "uniform"
    state = dict(server.state)
    hook(state, seen, 8)
    held = counts > 0
    means = sum(h[:, None] * r.uploads[PROTOTYPES] for h, r in zip(held, seen)) / np.maximum(held.sum(0), 1)[:, None]
    np.testing.assert_allclose(state[PROTOTYPES], means, rtol=1e-6, atol=1e-6)
    assert np.abs(state[PROTOTYPES] - server.state[PROTOTYPES]).max() > 1e-4


def test_client_prototypes_are_its_trained_models_class_means(tmp_path):
    rt = runtime(tmp_path, "fedproto")
    classes, dim = _shape(rt)
    uploads, _ = train_one(rt, {PROTOTYPES: np.zeros((classes, dim), np.float32),
                                COUNTS: np.zeros(classes, np.float32)}, CLIENT, 1)
    rt.layouts["full"].load(rt.slots["personal"][CLIENT])  # the client's whole model, as it keeps it
    rt.net.eval()
    x, y = rt.client_tensors(CLIENT, "train")
    ctx = ClientContext(rt, CLIENT, 1, {}, torch.Generator())
    with torch.no_grad():
        z = ctx.features(x)[0].double().numpy()
    labels = y.numpy()
    np.testing.assert_array_equal(uploads[COUNTS], np.bincount(labels, minlength=classes))
    for c in range(classes):
        expected = z[labels == c].mean(0) if (labels == c).any() else np.zeros(dim)
        np.testing.assert_allclose(uploads[PROTOTYPES][c], expected, rtol=1e-5, atol=1e-6)


MIXED = 7  # a client holding classes 1, 3, 4, 7 and 8 of the synthetic run


def _broadcast(rt) -> dict[str, np.ndarray]:
    """Global prototypes for the even classes only (for client MIXED: some of its classes), drawn at random."""
    classes, dim = _shape(rt)
    counts = np.where(np.arange(classes) % 2 == 0, 5.0, 0.0).astype(np.float32)
    prototypes = np.random.default_rng(0).normal(size=(classes, dim)).astype(np.float32) * (counts > 0)[:, None]
    return {PROTOTYPES: prototypes, COUNTS: counts}


@pytest.mark.parametrize("lam", [0.0, 1.0, 3.0])
def test_loss_is_cross_entropy_plus_lambda_times_the_prototype_mse(tmp_path, lam):
    rt = runtime(tmp_path, {"name": "fedproto", "lambda": lam})
    broadcast = _broadcast(rt)
    losses = rt.algorithm.client_update(ClientContext(rt, MIXED, 1, broadcast, torch.Generator().manual_seed(7)))
    # The first step by hand, on the same batch of the round-0 model.
    ctx = ClientContext(rt, MIXED, 1, broadcast, torch.Generator().manual_seed(7))
    rt.layouts["full"].load(rt.plan.model.initial["full"])
    rt.net.train()
    x, y = next(ctx.batches(1))
    with torch.no_grad():
        z, logits = ctx.features(x)
    known = torch.from_numpy(broadcast[COUNTS] > 0)[y]
    target = torch.where(known[:, None], torch.from_numpy(broadcast[PROTOTYPES])[y], z)
    pull = ((z - target) ** 2).sum() / z.numel()  # rows without a global prototype add 0 but count (PFLlib)
    assert known.any() and not known.all()
    ce = torch.nn.functional.cross_entropy(logits, y)
    assert losses[0].item() == pytest.approx((ce + lam * pull).item(), rel=1e-6)
    assert pull.item() > 1e-3  # so lambda changes the loss


def test_lambda_zero_is_plain_local_training_bit_for_bit(tmp_path):
    proto, local = runtime(tmp_path, {"name": "fedproto", "lambda": 0.0}), runtime(tmp_path, "local")
    pulled = runtime(tmp_path, {"name": "fedproto", "lambda": 1.0})
    broadcast = _broadcast(proto)
    train_one(proto, broadcast, MIXED, 1)
    train_one(pulled, broadcast, MIXED, 1)
    train_one(local, {WEIGHTS: local.plan.model.initial["shared"]}, MIXED, 1)
    assert np.array_equal(proto.slots["personal"][MIXED], local.slots["personal"][MIXED])
    assert np.abs(pulled.slots["personal"][MIXED] - local.slots["personal"][MIXED]).max() > 1e-4


def test_a_client_is_scored_with_its_classifier_and_with_the_nearest_global_prototype(tmp_path):
    """acc: the client's own classifier ("w/o protos"); fedproto_acc_prototypes: the label of the nearest global
    prototype in mean squared distance, classes without one left out (PFLlib's test_metrics, its leaderboard's number).
    Before any prototype exists only acc is recorded."""
    rt = runtime(tmp_path, "fedproto")
    classes, dim = _shape(rt)
    empty = {PROTOTYPES: np.zeros((classes, dim), np.float32), COUNTS: np.zeros(classes, np.float32)}
    train_one(rt, empty, MIXED, 1)
    assert "fedproto_acc_prototypes" not in rt.evaluate(empty, [MIXED], 1)[0]
    broadcast = _broadcast(rt)
    [record] = rt.evaluate(broadcast, [MIXED], 1)
    rt.layouts["full"].load(rt.slots["personal"][MIXED])
    rt.net.eval()
    x, y = rt.client_tensors(MIXED, "test")
    with torch.no_grad():
        z = ClientContext(rt, MIXED, 1, {}, torch.Generator()).features(x)[0].double().numpy()
        own = (rt.net(x).argmax(1) == y).double().mean().item()
    distance = ((z[:, None, :] - broadcast[PROTOTYPES][None].astype(np.float64)) ** 2).mean(2)
    distance[:, broadcast[COUNTS] == 0] = np.inf
    expected = float((distance.argmin(1) == y.numpy()).mean())
    assert record["fedproto_acc_prototypes"] == pytest.approx(expected, abs=1e-12)
    assert record["acc"] == pytest.approx(own, abs=1e-6)
    assert expected < 1  # the odd classes have no prototype: their samples are never right
