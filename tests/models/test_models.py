import pytest
import torch

from fedsim.config import ModelConfig
from fedsim.models import MODELS, build_model
from fedsim.models.lightning import FedClient, split_keys


def split(net, personal_layers: int) -> tuple[list[str], list[str]]:
    """(body keys, head keys) of a fedsim model at K_P, as a run splits the built-in client."""
    keys = split_keys(FedClient(net), ModelConfig(personal_layers=personal_layers))
    return list(keys.body), list(keys.head)


@pytest.mark.parametrize("name,blocks", [("cnn4", 4), ("resnet34", 16), ("mobilenet_v1", 13)])
def test_forward_shape_and_depth(name, blocks):
    net = build_model(name, 10, (3, 32, 32))
    assert len(net.blocks) == blocks
    assert net.max_personal_layers == blocks + 1
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_personal_layers_are_structural(name):
    net = build_model(name, 7, (3, 32, 32))
    keys = list(net.state_dict())
    base0, head0 = split(net, 0)
    assert head0 == [] and base0 == keys  # K_P = 0: everything shared

    base1, head1 = split(net, 1)
    assert head1 and all(k.startswith("classifier.") for k in head1)
    assert set(base1) | set(head1) == set(keys) and not set(base1) & set(head1)

    last = len(net.blocks) - 1
    _, head2 = split(net, 2)
    assert set(head2) == set(head1) | {k for k in keys if k.startswith(f"blocks.{last}.")}

    _, head_all = split(net, net.max_personal_layers)
    assert all(k.startswith(("classifier", "blocks.")) for k in head_all)
    assert len(head_all) == len([k for k in keys if not k.startswith("stem.")])


def test_personal_layers_validated_against_depth():
    net = build_model("cnn4", 10, (3, 32, 32))
    with pytest.raises(ValueError, match="model.personal_layers: 6 is outside 0..5"):
        split(net, 6)


def test_cnn4_matches_fedbabu_architecture():
    net = build_model("cnn4", 10, (3, 32, 32))
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(64, (3, 3))] * 4
    linear = net.classifier[-1]
    assert (linear.in_features, linear.out_features) == (256, 10)


def test_linear_base_keeps_cnn4_personal_layer():
    cnn, lin = build_model("cnn4", 10, (3, 32, 32)), build_model("linear_base", 10, (3, 32, 32))
    assert len(lin.blocks) == 1 and isinstance(lin.blocks[0][0], torch.nn.Linear)
    assert cnn.output_layer.weight.shape == lin.output_layer.weight.shape == (10, 256)
    _, head = split(lin, 1)
    assert head == ["classifier.weight", "classifier.bias"]


def test_mlp_on_feature_vectors():
    net = build_model("mlp", 10, (60, 1, 1))
    assert net(torch.randn(4, 60, 1, 1)).shape == (4, 10)


def test_unknown_model_names_choices():
    with pytest.raises(ValueError, match="model.name: unknown model 'vgg'"):
        build_model("vgg", 10, (3, 32, 32))


@pytest.mark.parametrize("name", ["cnn4", "pfllib_cnn", "mlp", "linear_base", "mobilenet_v1"])
def test_models_are_sized_from_the_height_and_the_width_of_images_that_are_not_square(name):
    net = build_model(name, 3, (3, 48, 40))  # the 48x40 images: cnn4 was sized 48x48 and failed in training
    assert net(torch.zeros(2, 3, 48, 40)).shape == (2, 3)


def test_a_model_sized_for_other_images_is_refused_in_one_line():
    from user_plugins import square_only

    from fedsim.models.shape import check_forward

    with pytest.raises(ValueError, match=r"model.name: square cannot take the data's 3x48x40 \(CxHxW\) images "
                                         r"\(mat1 and mat2 shapes cannot be multiplied"):
        check_forward(square_only(4, 3, (48, 40)), (3, 48, 40), 4, "square")
    check_forward(square_only(4, 3, 40), (3, 40, 40), 4, "square")
    with pytest.raises(ValueError, match=r"gives outputs of shape \(2, 5\) for 2 images; a classifier of 4 classes"):
        check_forward(square_only(5, 3, 40), (3, 40, 40), 4, "square")
