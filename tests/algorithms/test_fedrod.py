"""FedRoD's defining properties: the generic model descends the balanced softmax loss, the personal head stays on
its client, and a client is scored with generic + personal logits."""
import numpy as np
import pytest
import torch
from conftest import train_one
from test_algorithms import CLIENT, runtime, start, started

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.context import ClientContext
from fedsim.algorithms.fedrod import HEAD
from fedsim.core.protocol import payload_bytes

ONE_STEP = {"train__batch_size": 10_000, "train__local_epochs": 1}  # a client's whole data in one batch


def _hand_step(rt, generic: np.ndarray, balanced: bool) -> np.ndarray:
    """The generic model after one full-batch SGD step (momentum's first step is the gradient) on the loss written
    out: -log(n_y e^(l_y) / sum_c n_c e^(l_c)), n_c the client's training count of class c (balanced softmax)."""
    ctx = ClientContext(rt, CLIENT, 1, {WEIGHTS: generic}, torch.Generator())
    ctx.load()
    x, y = ctx.data()
    counts = torch.bincount(y, minlength=rt.plan.num_classes).double()
    weights = counts if balanced else torch.ones_like(counts)
    logits = rt.net(x).double()
    loss = -(torch.log(weights[y] * logits.gather(1, y[:, None]).squeeze(1).exp())
             - torch.log((weights * logits.exp()).sum(1))).mean()
    rt.net.zero_grad()
    loss.backward()
    lr = rt.settings.lr("body", 1)
    with torch.no_grad():
        return torch.cat([(p - lr * p.grad).flatten() for p in rt.net.parameters()]).numpy()


def test_generic_model_descends_the_balanced_softmax_loss(tmp_path):
    for balanced in (True, False):
        rt = runtime(tmp_path, {"name": "fedrod", "balanced": balanced}, **ONE_STEP)
        assert not all(np.bincount(rt.client_tensors(CLIENT, "train")[1].numpy(), minlength=rt.plan.num_classes))
        g = start(rt)
        expected = {b: _hand_step(rt, g[WEIGHTS], b) for b in (True, False)}
        uploads, _ = train_one(rt, g, CLIENT, 1)
        np.testing.assert_allclose(uploads[WEIGHTS], expected[balanced], rtol=0, atol=1e-6)
        assert np.abs(uploads[WEIGHTS] - expected[not balanced]).max() > 1e-4  # the prior changes the step


def test_personal_head_never_leaves_the_client(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedrod", train__rounds=1)
    layout = server.plan.model.layouts
    assert layout["shared"].keys == layout["full"].keys  # the network holds the generic model only
    result = server.round(1)
    assert set(server.algorithm.uploads) == {WEIGHTS}
    assert {c["bytes_up"] for c in result.comm} == {payload_bytes(layout["shared"].size)}
    rt = runtime(tmp_path, "fedrod")
    uploads, _ = train_one(rt, start(rt), CLIENT, 1)
    layer = rt.output_layer
    assert rt.slots[HEAD][CLIENT].size == layer.out_features * (layer.in_features + 1)
    assert set(uploads) == {WEIGHTS} and uploads[WEIGHTS].size == layout["shared"].size


def test_scoring_adds_the_personal_heads_logits_and_training_does_not(tmp_path):
    rt, fresh = runtime(tmp_path, "fedrod", eval__finetune_epochs=0), runtime(tmp_path, "fedrod")
    g = start(rt)
    uploads, _ = train_one(rt, g, CLIENT, 1)
    after = {WEIGHTS: uploads[WEIGHTS]}
    ctx = ClientContext(rt, CLIENT, 1, after, torch.Generator())
    ctx.load()
    rt.net.eval()
    x, y = rt.client_tensors(CLIENT, "test")
    with torch.no_grad():
        z, generic = ctx.features(x)
    head = torch.tensor(rt.slots[HEAD][CLIENT])
    split = rt.output_layer.weight.numel()
    personalized = generic + z @ head[:split].view_as(rt.output_layer.weight).T + head[split:]
    [rec] = rt.evaluate(after, [CLIENT], 1)
    assert rec["loss"] == pytest.approx(torch.nn.functional.cross_entropy(personalized, y).item(), rel=1e-6)
    assert rec["acc"] == (personalized.argmax(1) == y).float().mean().item()
    assert rec["loss"] != pytest.approx(torch.nn.functional.cross_entropy(generic, y).item(), rel=1e-3)
    # The scoring hook is gone once the client trains again: the same round as on a runtime that never scored.
    train_one(fresh, g, CLIENT, 1)
    a, _ = train_one(rt, after, CLIENT, 2)
    b, _ = train_one(fresh, after, CLIENT, 2)
    assert np.array_equal(a[WEIGHTS], b[WEIGHTS])
    assert np.array_equal(rt.slots[HEAD][CLIENT], fresh.slots[HEAD][CLIENT])
