"""FedBABU's ``head_init: orthogonal_scaled``: orthogonal rows at the row norm nn.Linear's default init has in
expectation, so FedBABU's fixed head and FedAvg's default-initialised head start at one logit scale."""
import math

import pytest
import torch
from torch import nn

from fedsim.algorithms import build_algorithm
from fedsim.algorithms.fedbabu import default_row_norm
from fedsim.config import validate
from fedsim.models.lightning import network_of
from fedsim.models.state import output_layer
from fedsim.plan.build import initial_client
from fedsim.reproduce.runner import base_tree
from fedsim.reproduce import PAPERS


@pytest.mark.parametrize("fan_in", [256, 1024, 7])  # the 4-conv CNN's head, MobileNet's, a narrow one
def test_default_row_norm_is_computed_from_the_fan_in_and_matches_nn_linear(fan_in):
    """kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), so E||row||^2 = fan_in / (3 fan_in) = 1/3."""
    torch.manual_seed(0)
    layer = nn.Linear(fan_in, 100)
    assert default_row_norm(layer) == pytest.approx(1 / math.sqrt(3))
    squared = torch.stack([nn.Linear(fan_in, 100).weight.norm(dim=1) ** 2 for _ in range(50)])  # 5,000 rows
    assert squared.mean().item() == pytest.approx(1 / 3, abs=0.01)


def _head(algorithm) -> nn.Linear:
    """The round-0 output layer of the FedBABU CPU base (the authors' 4-conv CNN, 256 -> 100), as a run builds it."""
    cfg = validate({**base_tree(PAPERS["fedbabu"], "cpu"), "algorithm": algorithm})
    module, keys = initial_client(cfg, build_algorithm(cfg), 100, (3, 32, 32))
    return output_layer(network_of(module), keys.head)


def test_orthogonal_scaled_rows_are_orthogonal_at_the_default_inits_norm_as_fedavgs_head():
    scaled = _head({"name": "fedbabu", "head_init": "orthogonal_scaled"})
    w = scaled.weight.detach()
    assert w.shape == (100, 256)
    torch.testing.assert_close(w @ w.T, torch.eye(100) / 3, atol=1e-5, rtol=0)  # orthogonal, every row 1/sqrt(3)
    assert not scaled.bias.detach().any()

    fedavg_rows = _head("fedavg").weight.detach().norm(dim=1)  # nn.Linear's default init, FedAvg's starting head
    assert fedavg_rows.mean().item() == pytest.approx(default_row_norm(scaled), abs=0.01)  # measured 0.576
    assert w.norm(dim=1).mean().item() == pytest.approx(fedavg_rows.mean().item(), abs=0.01)
    unit = _head("fedbabu").weight.detach().norm(dim=1)  # `orthogonal`: unit rows, the 1.7x logit scale
    assert unit.mean().item() / fedavg_rows.mean().item() == pytest.approx(math.sqrt(3), rel=0.02)


def test_fedbabu_fine_tunes_from_the_global_model_or_after_one_more_local_update(tmp_path):
    """finetune_from: global (the authors) scores and fine-tunes the received model; own_update (PFLlib) fine-tunes
    after one more local update of the body. The initial score and the client's kept state are the same."""
    from test_algorithms import CLIENT, runtime, start, train_one

    records, kept = {}, {}
    for variant in ("global", "own_update"):
        rt = runtime(tmp_path, {"name": "fedbabu", "finetune_from": variant}, eval__finetune_epochs=1)
        state = start(rt)
        uploads, _ = train_one(rt, state, CLIENT, 1)
        after = {"weights": uploads["weights"]}
        records[variant] = rt.evaluate(after, [CLIENT], 1)[0]
        kept[variant] = rt.slots["personal"][CLIENT].copy()
    assert records["global"]["acc"] == records["own_update"]["acc"]
    assert records["global"]["loss_personalized"] != records["own_update"]["loss_personalized"]
    assert kept["global"].tobytes() == kept["own_update"].tobytes()
