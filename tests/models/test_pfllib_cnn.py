"""model.name: pfllib_cnn -- PFLlib's FedAvgCNN (TsingZ0/PFLlib system/flcore/trainmodel/models.py) as a SplitNet:
its size, its layers, its personal head, and a federated round (sequential and packed) through the engine."""
import numpy as np
import pytest
import torch
from conftest import client_runtime, in_process_server, small_config
from torch import nn

from fedsim.core.protocol import RoundResult
from fedsim.models import MODELS, build_model
from fedsim.models.packed import why_unpackable


def pfllib_parameters(in_features: int, num_classes: int, dim: int) -> int:
    """FedAvgCNN's parameter count, layer by layer as PFLlib writes it (weights + biases)."""
    conv1 = in_features * 32 * 5 * 5 + 32
    conv2 = 32 * 64 * 5 * 5 + 64
    fc1 = dim * 512 + 512
    fc = 512 * num_classes + num_classes
    return conv1 + conv2 + fc1 + fc


@pytest.mark.parametrize("shape,classes,dim", [((3, 32, 32), 10, 1600), ((3, 32, 32), 100, 1600),
                                               ((1, 28, 28), 62, 1024)])
def test_the_parameter_count_is_pfllibs(shape, classes, dim):
    """PFLlib's main.py: dim=1600 for 32x32 CIFAR, 1024 for 28x28 MNIST/FEMNIST; 878,538 parameters on CIFAR-10."""
    net = build_model("pfllib_cnn", classes, shape)
    assert sum(p.numel() for p in net.parameters()) == pfllib_parameters(shape[0], classes, dim)
    assert net.blocks[2][1].in_features == dim
    assert pfllib_parameters(3, 10, 1600) == 878_538


def test_layers_forward_shape_and_no_batchnorm():
    net = build_model("pfllib_cnn", 10, (3, 32, 32))
    assert "pfllib_cnn" in MODELS and len(net.blocks) == 3 and net.max_personal_layers == 4
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding, c.stride) for c in convs] == [
        (3, 32, (5, 5), (0, 0), (1, 1)), (32, 64, (5, 5), (0, 0), (1, 1))]
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(1600, 512), (512, 10)]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    assert not any(isinstance(m, nn.Dropout) for m in net.modules())
    assert net.features(torch.randn(2, 3, 32, 32)).shape == (2, 512)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert build_model("pfllib_cnn", 62, (1, 28, 28))(torch.randn(3, 1, 28, 28)).shape == (3, 62)
    assert why_unpackable(net) is None  # every layer has a packed form


def test_the_personal_head_is_the_final_linear_at_kp_1():
    """PFLlib's FedPer/FedRep: head = model.fc (the last Linear); K_P = 2 adds fc1, K_P = 4 everything."""
    net = build_model("pfllib_cnn", 10, (3, 32, 32))
    base, head = net.split_keys(1)
    assert head == ["classifier.weight", "classifier.bias"] and net.output_layer is net.classifier
    assert base == ["blocks.0.0.weight", "blocks.0.0.bias", "blocks.1.0.weight", "blocks.1.0.bias",
                    "blocks.2.1.weight", "blocks.2.1.bias"]
    assert net.split_keys(2)[1] == ["blocks.2.1.weight", "blocks.2.1.bias", "classifier.weight", "classifier.bias"]
    assert net.split_keys(0)[1] == [] and net.split_keys(4)[0] == []
    with pytest.raises(ValueError, match="model.personal_layers: 5 is outside 0..4"):
        net.split_keys(5)


def test_too_small_an_input_is_named():
    with pytest.raises(ValueError, match="model.name: pfllib_cnn needs inputs of at least 16x16"):
        build_model("pfllib_cnn", 10, (3, 15, 15))


def test_a_fedper_round_on_cifar10(tmp_path, data_root, monkeypatch):
    """One round through the engine's server: the shared part is everything but Linear(512, 10), it trains, and
    every client is scored."""
    cfg = small_config(tmp_path, data_root, model__name="pfllib_cnn", algorithm="fedper", train__rounds=1,
                       train__eval_every=1, train__batch_size=20)
    server = in_process_server(cfg)
    plan = server.plan
    assert plan.model.parameters == 878_538
    initial = plan.model.initial["shared"].copy()
    assert initial.size == 878_538 - (512 * 10 + 10)
    server.restore(None)
    result = server.round(1)
    assert isinstance(result, RoundResult), result
    assert sorted(rec["client"] for rec in result.records) == [0, 1, 2, 3, 4]
    assert all(0 <= rec["acc"] <= 1 for rec in result.records)
    weights = server.state["weights"]
    assert weights.shape == initial.shape and np.isfinite(weights).all() and not np.array_equal(weights, initial)


def test_a_packed_fedper_round_agrees_with_sequential(data_root):
    """engine.pack trains pfllib_cnn packed (no fallback) and agrees with one-after-another training within
    docs/packed.md's tolerance (as tests/client/test_packed.py checks for cnn4)."""
    def one_round(pack):
        rt = client_runtime(data_root, "fedper", clients=5, model__name="pfllib_cnn", engine__pack=pack,
                            eval__finetune_epochs=0)
        assert rt.plan.packing == (pack, None)  # packed, not fallen back to one after another
        broadcast = {"weights": rt.plan.model.initial["shared"]}
        return list(rt.train_clients(broadcast, list(range(5)), 1))

    sequential, packed = one_round(1), one_round(4)
    for s, p in zip(sequential, packed):
        assert float(p.loss) == pytest.approx(float(s.loss), rel=1e-4)
        for name, value in s.uploads.items():
            got, value = p.uploads[name].cpu().numpy(), value.cpu().numpy()
            assert float(np.abs(got - value).max()) <= 1e-3 * float(np.abs(value).max(initial=1e-12)), name
