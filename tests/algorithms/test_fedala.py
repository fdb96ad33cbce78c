"""FedALA's defining properties: a client starts its round from its local model with the received global model mixed
in by learned element-wise weights W in [0, 1] in the top layers (lower layers: the global values), and W learns
toward whichever of the two has the lower loss."""
import numpy as np
import torch
from conftest import train_one
from test_algorithms import CLIENT, runtime, start

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.context import ClientContext

OTHER = 0


def _spy_start(monkeypatch) -> list[np.ndarray]:
    """The model every local training starts from (packed at its ctx.sgd call)."""
    starts, sgd = [], ClientContext.sgd

    def spy(self, *args, **kwargs):
        starts.append(self.pack("full"))
        return sgd(self, *args, **kwargs)

    monkeypatch.setattr(ClientContext, "sgd", spy)
    return starts


def _count_passes(monkeypatch) -> list[int]:
    """Passes of W's learning: each draws one epoch of its sample's batches from ctx.batches (training, ctx.sgd,
    draws its own)."""
    passes, batches = [], ClientContext.batches

    def spy(self, *args, **kwargs):
        passes.append(1)
        return batches(self, *args, **kwargs)

    monkeypatch.setattr(ClientContext, "batches", spy)
    return passes


def test_fedala_with_w_at_one_starts_from_the_global_model_and_lower_layers_are_always_global(tmp_path):
    rt = runtime(tmp_path, {"name": "fedala", "score": "stored_w"})  # scored with the stored W as it is
    glob = start(rt)
    train_one(rt, glob, CLIENT, 1)
    local, layout = rt.slots["local_model"][CLIENT].copy(), rt.plan.model.layouts["full"]
    top = rt.algorithm.top_keys(rt.net)
    assert top == ["classifier.weight", "classifier.bias"]  # p = 1: the output Linear
    arrays = {"global": layout.arrays(glob[WEIGHTS]), "local": layout.arrays(local)}  # shared = full here
    for fill, top_from in ((1.0, "global"), (0.0, "local")):
        rt.slots["ala_weights"][CLIENT] = np.full(layout.size, fill, np.float32)
        ctx = ClientContext(rt, CLIENT, 1, glob, torch.Generator())
        rt.algorithm.load_for_evaluation(ctx)
        got = layout.arrays(ctx.pack("full"))
        for key in layout.keys:
            assert np.array_equal(got[key], arrays[top_from if key in top else "global"][key]), (fill, key)


def test_fedala_learns_w_in_zero_one_until_settled_once_then_one_pass_a_round(tmp_path, monkeypatch):
    rt = runtime(tmp_path, "fedala")
    glob = start(rt)
    train_one(rt, glob, CLIENT, 1)
    local = rt.slots["local_model"][CLIENT].copy()  # the store's row is overwritten by the next round
    other, _ = train_one(rt, glob, OTHER, 1)
    received = {WEIGHTS: other[WEIGHTS]}  # a global model that differs from the client's local one
    starts, passes = _spy_start(monkeypatch), _count_passes(monkeypatch)
    train_one(rt, received, CLIENT, 2)
    layout, top = rt.plan.model.layouts["full"], rt.algorithm.top_keys(rt.net)
    w = layout.arrays(rt.slots["ala_weights"][CLIENT])
    init, g, loc = layout.arrays(starts[0]), layout.arrays(received[WEIGHTS]), layout.arrays(local)
    assert len(passes) > rt.algorithm.params.num_pre_loss  # the start phase ran until the losses settled
    for key in layout.keys:
        if key in top:
            assert w[key].min() >= 0 and w[key].max() <= 1
            mixed = torch.lerp(*(torch.tensor(a[key]) for a in (loc, g, w)))
            assert np.array_equal(init[key], mixed.numpy())
        else:
            assert np.array_equal(init[key], g[key]) and (w[key] == 1).all()  # the lower layers: global, untouched
    assert any((w[key] < 1).any() for key in top)  # W learned
    settled = len(passes)
    train_one(rt, received, CLIENT, 3)
    assert len(passes) == settled + 1  # later rounds: one pass


def _negated_head(rt, vector: np.ndarray) -> np.ndarray:
    out = vector.copy()
    arrays = rt.plan.model.layouts["full"].arrays(out)
    arrays["classifier.weight"] *= -1  # views into ``out``: logits flipped, a much worse head
    return out


def test_fedala_w_moves_the_start_toward_the_lower_loss_side(tmp_path, monkeypatch):
    rt = runtime(tmp_path, "fedala", train__local_epochs=5)
    train_one(rt, start(rt), CLIENT, 1)
    good = rt.slots["local_model"][CLIENT].copy()
    bad = _negated_head(rt, good)
    starts = _spy_start(monkeypatch)
    where = {}  # the start's place on the segment local -> global: 0 at the local model, 1 at the global one
    for case, (local, glob) in {"local better": (good, bad), "global better": (bad, good)}.items():
        rt.slots["local_model"][CLIENT] = local
        rt.train_client({WEIGHTS: glob}, CLIENT, 2)  # not kept: the next case starts afresh too
        gap = glob.astype(np.float64) - local
        where[case] = float((starts[-1] - local) @ gap / (gap @ gap))
        ctx = ClientContext(rt, CLIENT, 2, {WEIGHTS: glob}, torch.Generator())
        losses = {}
        for name, vector in (("start", starts[-1]), ("bad", bad)):
            ctx.unpack("full", vector)
            losses[name] = ctx.score()[0]
        assert losses["start"] < losses["bad"], case
    # W starts at 1 (the global model): it leaves it for a better local model, far less for a worse one.
    assert where["local better"] < 0.9 and where["local better"] < where["global better"] - 0.2, where


def test_fedala_is_scored_after_its_ala_step_on_the_newest_global_model_and_keeps_its_stored_w(tmp_path):
    """PFLlib runs ALA for every client before evaluating (serverala.py:26-31, 70-74): the default scores the mix
    under W learned from the stored one on the received model; the stored W is not changed by scoring."""
    after, stored = runtime(tmp_path, "fedala"), runtime(tmp_path, {"name": "fedala", "score": "stored_w"})
    glob = start(after)
    for rt in (after, stored):
        train_one(rt, glob, CLIENT, 1)
        train_one(rt, glob, CLIENT, 2)  # the first ALA: W stored
    kept = after.slots["ala_weights"][CLIENT].copy()
    scored = {}
    for name, rt in (("after", after), ("stored", stored)):
        ctx = ClientContext(rt, CLIENT, 2, glob, torch.Generator().manual_seed(0))
        rt.algorithm.load_for_evaluation(ctx)
        scored[name] = ctx.pack("full")
    assert np.array_equal(after.slots["ala_weights"][CLIENT], kept)
    assert not np.array_equal(scored["after"], scored["stored"])
