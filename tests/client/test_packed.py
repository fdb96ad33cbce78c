"""Packed training (engine.pack): agreement with sequential training within the documented tolerance for every
packable method, a client's result independent of its pack-mates (so of the pack size and the number of workers),
resume, fallbacks and their notices."""
import numpy as np
import pytest
import torch
from conftest import client_runtime, in_process_server, round_records, six_client_run
from torch import nn

from fedsim.algorithms import ALGORITHMS
from fedsim.models.packed import PackedNet, Unpackable, why_unpackable

PACKABLE = sorted(name for name, cls in ALGORITHMS.items() if cls.packs())
CLIENTS = list(range(6))
QUICK = {"fedrep": {"head_epochs": 2}}
# docs/packed.md: after one local update, a packed client's uploads and state agree with sequential training's to
# this fraction of the largest value of each (measured at most 2.5e-4: FedBN's personal BatchNorm statistics;
# SCAFFOLD's control variates, a weight difference divided by K * lr, 1.4e-4; shared weights 1.3e-5).
TOLERANCE = 1e-3


def _round(data_root, algorithm, pack, **over):
    rt = client_runtime(data_root, {"name": algorithm, **QUICK.get(algorithm, {})}, clients=len(CLIENTS),
                        engine__pack=pack, eval__finetune_epochs=0, **over)
    broadcast = {"weights": rt.plan.model.initial["shared"]}
    broadcast |= {name: np.full_like(broadcast["weights"], 1e-3) for name in rt.algorithm.server_slots}
    return list(rt.train_clients(broadcast, CLIENTS, 1))


def _vectors(t) -> dict[str, np.ndarray]:
    return {**{f"upload {k}": v.cpu().numpy() for k, v in t.uploads.items()}, **{f"slot {k}": v for k, v in t.slots.items()}}


@pytest.mark.parametrize("algorithm", PACKABLE)
def test_packed_training_agrees_with_sequential_within_the_tolerance(data_root, algorithm):
    sequential, packed = _round(data_root, algorithm, 1), _round(data_root, algorithm, 4)
    for s, p in zip(sequential, packed):
        assert float(p.loss) == pytest.approx(float(s.loss), rel=1e-4)
        expected, got = _vectors(s), _vectors(p)
        assert expected.keys() == got.keys()
        for name, value in expected.items():
            if not value.size:  # local shares nothing
                continue
            scale = float(np.abs(value).max(initial=1e-12))
            assert float(np.abs(got[name] - value).max()) <= TOLERANCE * scale, name


@pytest.mark.parametrize("algorithm", ["fedavg", "fedper", "ditto", "scaffold", "fedrep", "fedprox"])
def test_a_packed_client_does_not_depend_on_its_pack_mates(data_root, algorithm):
    """Pack sizes 2, 3 and 5 put every client among other clients at other places: bit for bit the same."""
    runs = [_round(data_root, algorithm, pack) for pack in (2, 3, 5)]
    for a, b, c in zip(*runs):
        assert float(a.loss) == float(b.loss) == float(c.loss)
        va, vb, vc = _vectors(a), _vectors(b), _vectors(c)
        assert all(np.array_equal(va[k], vb[k]) and np.array_equal(va[k], vc[k]) for k in va)


def _server_rounds(monkeypatch, cfg, rounds=2):
    server = in_process_server(cfg)
    server.restore(None)
    return round_records([server.round(r) for r in range(1, rounds + 1)]), server.state


@pytest.mark.parametrize("algorithm, validation", [("fedper", 0.0), ("scaffold", 0.0), ("ditto", 0.0), ("ditto", 0.3)])
def test_packed_runs_are_bit_identical_on_one_two_and_three_workers(tmp_path, data_root, monkeypatch, algorithm,
                                                                     validation):
    results = [_server_rounds(monkeypatch, six_client_run(tmp_path, data_root, algorithm, workers,
                                                          validation=validation, pack=pack))
               for workers, pack in ((1, 2), (2, 3), (3, "auto"))]
    (one, state), *others = results
    assert all(records == one for records, _ in others)
    assert all(np.array_equal(state[k], s[k]) for _, s in others for k in state)
    sequential, _ = _server_rounds(monkeypatch, six_client_run(tmp_path, data_root, algorithm, 2, validation=validation))
    assert sequential != one  # packing is on: other kernels, other last bits
    assert all(("validation_acc" in rec) == bool(validation) for _, _, records, _ in one for rec in records)


@pytest.mark.parametrize("validation", [0.0, 0.3])
def test_a_resumed_packed_run_equals_an_undisturbed_one(tmp_path, data_root, monkeypatch, validation):
    cfg = six_client_run(tmp_path, data_root, "scaffold", 2, validation=validation, pack=2)
    expected, _ = _server_rounds(monkeypatch, cfg)
    first = in_process_server(cfg)
    first.restore(None)
    head = round_records([first.round(1)])
    ckpt = first.checkpoint(str(tmp_path / "run"), 1)
    resumed = in_process_server(six_client_run(tmp_path, data_root, "scaffold", 3, validation=validation,
                                                            pack=4))
    assert resumed.restore(ckpt) == 1
    assert head + round_records([resumed.round(2)]) == expected


def test_the_pack_size_leaves_the_fingerprint_packing_changes_it(tmp_path, data_root):
    from fedsim.config import resume_fingerprint

    prints = {pack: resume_fingerprint(six_client_run(tmp_path, data_root, "fedper", 2, pack=pack).model_dump())
              for pack in (1, 2, 8, "auto")}
    assert prints[2] == prints[8] == prints["auto"] != prints[1]
    unpacked = six_client_run(tmp_path, data_root, "fedper", 2).model_dump()
    del unpacked["engine"]["pack"]  # a config written before engine.pack keeps its fingerprint
    assert resume_fingerprint(unpacked) == prints[1]
    from conftest import plan_for  # a run that asks for packing but cannot pack is fingerprinted as it trains
    fallen_back = plan_for(six_client_run(tmp_path, data_root, "apfl", 2, pack=4)).fingerprint
    assert fallen_back == plan_for(six_client_run(tmp_path, data_root, "apfl", 2)).fingerprint


def test_methods_and_modules_without_a_packed_form_train_sequentially_and_say_why(tmp_path, data_root):
    from conftest import lightning_tree, plan_for, small_config

    from fedsim.config import validate

    assert plan_for(six_client_run(tmp_path, data_root, "fedper", 2, pack="auto")).packing == ("auto", None)
    apfl = plan_for(six_client_run(tmp_path, data_root, "apfl", 2, pack=4))
    assert apfl.packing[0] == 1 and "apfl" in apfl.packing[1] and apfl.packing[1].startswith("engine.pack: 4")
    own = plan_for(validate(lightning_tree(tmp_path, "LabelSmoothingClient", engine__pack=4, model__name="mlp")))
    assert own.packing[0] == 1 and "LabelSmoothingClient has a training_step of its own" in own.packing[1]
    adam = plan_for(small_config(tmp_path, data_root, train__body__optimizer="adam", engine__pack=2))
    assert adam.packing[0] == 1 and "adam" in adam.packing[1]


def test_layers_without_a_packed_form_are_named():
    assert why_unpackable(nn.Sequential(nn.Linear(4, 4), nn.ReLU())) is None
    assert "Dropout" in why_unpackable(nn.Sequential(nn.Linear(4, 4), nn.Dropout()))
    with pytest.raises(Unpackable, match="1: LSTM"):
        PackedNet(nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4)))


@pytest.mark.parametrize("model", ["cnn4", "mobilenet_v1", "resnet34", "mlp", "pfllib_cnn"])
def test_the_packed_forward_is_each_slots_own_forward(model):
    """Every built-in model: slot g of the packed forward is the model with slot g's weights (train-mode BatchNorm
    statistics included)."""
    from fedsim.models import build_model

    shape = (60, 1, 1) if model == "mlp" else (3, 32, 32)
    torch.manual_seed(0)
    nets = [build_model(model, 10, shape) for _ in range(3)]
    x = torch.randn(3, 4, *shape)
    expected = [net.train()(x[g]) for g, net in enumerate(nets)]
    torch.manual_seed(0)
    fresh = [build_model(model, 10, shape) for _ in range(3)]
    state = {k: torch.stack([net.state_dict()[k] for net in fresh]) for k in fresh[0].state_dict()}
    got = PackedNet(fresh[0])(x, state, training=True)
    for g in range(3):
        assert torch.allclose(got[g], expected[g], rtol=1e-3, atol=1e-4)
        for k, v in nets[g].state_dict().items():
            assert torch.allclose(state[k][g].to(v.dtype), v, rtol=1e-3, atol=1e-5), k


@pytest.mark.parametrize("model", ["cnn4", "mobilenet_v1", "resnet34", "mlp", "pfllib_cnn"])
def test_a_slots_result_does_not_depend_on_its_place_or_its_pack_mates(model):
    """Logits, gradients and BatchNorm statistics of one client's slot, bit for bit, at every place in packs of 2
    to 4 (the CPU's packed layout, channels_last)."""
    from torch.nn import functional as F

    from fedsim.models import build_model

    shape = (60, 1, 1) if model == "mlp" else (3, 32, 32)
    torch.set_num_threads(1)  # as a packed CPU worker runs (engine.threads_per_worker: 1, enforced)
    torch.manual_seed(0)
    net = build_model(model, 10, shape).to(memory_format=torch.channels_last)
    packed = PackedNet(net, channels_last=True)
    batch = 2 if model == "resnet34" else 5
    x, y = torch.randn(4, batch, *shape), torch.randint(0, 10, (4, batch))

    def slot_zero(order: list[int]) -> list[torch.Tensor]:
        state = {k: v.detach().unsqueeze(0).repeat(len(order), *[1] * v.dim()) for k, v in net.state_dict().items()}
        params = [k for k, _ in net.named_parameters()]
        for k in params:
            state[k].requires_grad_(True)
        logits = packed(x[order], state, training=True)
        loss = F.cross_entropy(logits.reshape(-1, 10), y[order].reshape(-1), reduction="none").view(len(order), -1)
        grads = torch.autograd.grad(loss.mean(1).sum(), [state[k] for k in params])
        at = order.index(0)
        return [logits[at], *(g[at] for g in grads), *(state[k][at] for k in state if "running" in k)]

    expected = slot_zero([0, 1])
    for order in ([1, 0], [2, 0], [3, 2, 0], [1, 3, 0, 2]):
        assert all(torch.equal(a, b) for a, b in zip(expected, slot_zero(order))), order


def test_auto_measures_and_prints_the_pack_size(data_root, capsys):
    rt = client_runtime(data_root, "fedavg", engine__pack="auto")
    size = rt.packing.size()
    assert size >= 2 and rt.packing.size() == size
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"engine.pack auto: {size} clients at once on cpu") and "; 4: " in line


def test_a_packed_client_offers_only_the_packable_port_and_refuses_the_rest_in_one_line(data_root):
    from fedsim.algorithms import PARTS
    from fedsim.algorithms.context import ClientContext
    from fedsim.client.packed_client import PackedClient
    from fedsim.errors import UserCodeError

    rt = client_runtime(data_root, "fedavg")
    port = PackedClient(rt, rt.layouts, rt.model.parameter_keys, "mine", thread=None)
    assert not hasattr(port, "net") and not hasattr(port, "score")  # no stubs: the port is the packable one
    ctx = ClientContext(port, 0, 1, {"weights": rt.initial("shared")}, torch.Generator())
    asks = {"reads ctx.net": lambda: ctx.net, "scores its model (ctx.score)": ctx.score,
            "steps its own batches (ctx.batches)": lambda: next(ctx.batches(1)),
            "steps its own optimizer (ctx.param_groups)": lambda: ctx.param_groups(PARTS["full"])}
    for what, ask in asks.items():
        with pytest.raises(UserCodeError) as refused:
            ask()
        assert str(refused.value) == (f"engine.pack: algorithm mine {what}, which a packed client cannot; drop "
                                      "packable = True from the method, or set engine.pack: 1")
    with pytest.raises(UserCodeError, match="^engine.pack: algorithm mine asks ctx.sgd for an after_step callback, "
                                           "which packed training does not run; drop packable = True"):
        ctx.sgd(PARTS["full"], 1, after_step=lambda x, y: None)


def test_a_subclass_that_writes_its_own_hook_is_packed_only_if_it_says_so():
    from fedsim.algorithms.fedavg import FedAvg
    from fedsim.algorithms.fedprox import FedProx

    class SameHooks(FedProx):
        name = "same_hooks"

    class OwnPenalty(FedProx):
        name = "own_penalty"

        def penalty(self, ctx):
            return None

    class DeclaredPenalty(OwnPenalty):
        packable = True

        def penalty(self, ctx):
            return None

    assert FedAvg.packs() and SameHooks.packs() and DeclaredPenalty.packs()
    assert not OwnPenalty.packs() and not ALGORITHMS["apfl"].packs()


def test_a_splitnet_with_a_forward_of_its_own_is_not_packed():
    from fedsim.models.split import SplitNet

    class Scaled(SplitNet):
        def forward(self, x):
            return 2 * super().forward(x)

    net = Scaled(nn.Flatten(), [nn.Sequential(nn.Linear(4, 4), nn.ReLU())], nn.Linear(4, 2))
    assert why_unpackable(net) == "Scaled has a forward of its own"


def test_lockstep_serves_every_request_together_and_ends_cleanly_when_a_hook_fails():
    from fedsim.client.lockstep import in_lockstep

    served = []

    def serve(requests):
        served.append(sorted(requests))
        return [r * 10 for r in requests]

    def hook(i, asks):
        def run(thread):
            return [thread.ask(i + k) for k in range(asks)]
        return run

    assert in_lockstep([hook(0, 2), hook(100, 1), hook(200, 2)], serve) == [[0, 10], [1000], [2000, 2010]]
    assert served == [[0, 100, 200], [1, 201]]

    cleanups = []

    def failing(thread):
        thread.ask(1)
        raise ValueError("boom")

    def asks_again_in_cleanup(thread):
        try:
            thread.ask(2)
            thread.ask(3)
        finally:
            cleanups.append("ran")
            with pytest.raises(BaseException):
                thread.ask(4)  # an ended hook asks nothing more: no hang

    with pytest.raises(ValueError, match="boom"):
        in_lockstep([failing, asks_again_in_cleanup, hook(0, 1)], serve)
    assert cleanups == ["ran"]
