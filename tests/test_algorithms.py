"""Each algorithm's defining property, checked on a worker runtime with real CIFAR-10 data."""
import numpy as np
import pytest
import torch

from fedsim.algorithms import ALGORITHMS
from fedsim.client import FedClient
from fedsim.config import ConfigError, validate
from fedsim.data import load_dataset, make_partition
from fedsim.engine.worker import ClientData, ClientRuntime, load_client_class

CLIENT = 2


def runtime(data_root, algorithm, **train):
    cfg = validate({
        "seed": 3, "algorithm": algorithm,
        "data": {"root": str(data_root), "num_clients": 5, "partition": "classes", "k": 2,
                 "train_fraction": 0.01, "test_fraction": 0.02},
        "train": {"local_epochs": 1, "batch_size": 25, **train},
        "eval": {"finetune_epochs": 2},
    })
    data = load_dataset("cifar10", data_root)
    part = make_partition("classes", data.train_y, data.test_y, 5, 3, k=2, train_fraction=0.01, test_fraction=0.02)
    return ClientRuntime(cfg.model_dump(), {c: ClientData(part.train[c], part.test[c]) for c in range(5)})


def global0(rt):
    return rt.shared_layout.pack(rt.net)


def test_every_algorithm_trains_and_evaluates(data_root):
    for name in sorted(ALGORITHMS):
        rt = runtime(data_root, name)
        [u] = rt.train(global0(rt), [CLIENT], round_idx=1)
        assert np.isfinite(u.train_loss) and u.shared.shape == (rt.shared_layout.size,)
        [rec] = rt.evaluate(global0(rt), [CLIENT], round_idx=1)
        assert 0 <= rec["acc"] <= 1 and 0 <= rec["acc_personalized"] <= 1


def test_fedbabu_head_is_orthogonal_and_never_changes(data_root):
    rt = runtime(data_root, "fedbabu")
    w = rt.net.output_layer.weight.detach()
    torch.testing.assert_close(w @ w.T, torch.eye(w.shape[0]), atol=1e-5, rtol=0)
    head_before = rt.initial_personal.copy()
    g = global0(rt)
    for r in (1, 2):
        [u] = rt.train(g, [CLIENT], round_idx=r)
        g = u.shared
    assert np.array_equal(rt.personal[CLIENT], head_before)  # bit-identical after training
    assert not np.array_equal(g, global0(runtime(data_root, "fedbabu")))  # while the body did train
    # Every client starts from the same head: it is built from the run's seed, not the worker.
    assert np.array_equal(runtime(data_root, "fedbabu").initial_personal, head_before)


def test_lg_fedavg_never_sends_the_body(data_root):
    rt = runtime(data_root, "lg_fedavg")
    assert rt.shared_layout.keys and all(k.startswith("classifier.") for k in rt.shared_layout.keys)
    assert not any(k.startswith("classifier.") for k in rt.personal_layout.keys)
    [u] = rt.train(global0(rt), [CLIENT], round_idx=1)
    assert u.shared.size == rt.net.output_layer.weight.numel() + rt.net.output_layer.bias.numel()


def test_fedrep_trains_head_then_body(data_root):
    rt = runtime(data_root, "fedrep", head_epochs=2)
    phases = []
    step = rt.client_module.training_step

    def spy(batch, idx):
        phases.append(frozenset(rt.client_module.trainable))
        return step(batch, idx)

    rt.client_module.training_step = spy
    rt.module.training_step = spy
    rt.train(global0(rt), [CLIENT], round_idx=1)
    per_epoch = -(-len(rt.client_data[CLIENT].train) // 25)
    assert phases == [frozenset({"head"})] * (2 * per_epoch) + [frozenset({"body"})] * per_epoch


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(data_root):
    avg, prox0, prox = runtime(data_root, "fedavg"), runtime(data_root, "fedprox", mu=0.0), runtime(data_root, "fedprox", mu=1.0)
    g = global0(avg)
    [a], [p0], [p] = (rt.train(g, [CLIENT], round_idx=1) for rt in (avg, prox0, prox))
    assert np.array_equal(a.shared, p0.shared)
    # A real mu pulls the update toward the global weights.
    assert np.linalg.norm(p.shared - g) < np.linalg.norm(a.shared - g)


def test_ditto_personal_model_moves_toward_global_as_lambda_grows(data_root):
    dist = {}
    for lam in (0.0, 5.0, 50.0):
        rt = runtime(data_root, "ditto", ditto_lambda=lam, local_epochs=2)
        g = global0(rt)
        [u] = rt.train(g, [CLIENT], round_idx=1)
        personal = rt.personal_models[CLIENT]
        assert not np.array_equal(personal, u.shared)  # the personal model is not the global update
        # Distance over parameters only: BatchNorm running statistics are not regularised.
        params = dict(rt.net.named_parameters())
        lay = rt.full_layout
        mask = np.zeros(lay.size, bool)
        for key, start, end in zip(lay.keys, lay.offsets, lay.offsets[1:]):
            mask[start:end] = key in params
        dist[lam] = float(np.linalg.norm((personal - g)[mask]))
    assert dist[50.0] < dist[5.0] < dist[0.0]


def test_evaluation_finetuning_leaves_training_state_untouched(data_root):
    with_eval, without = runtime(data_root, "fedper"), runtime(data_root, "fedper")
    g = global0(with_eval)
    [u1] = with_eval.train(g, [CLIENT], round_idx=1)
    without.train(g, [CLIENT], round_idx=1)
    personal = with_eval.personal[CLIENT].copy()
    [rec] = with_eval.evaluate(u1.shared, [CLIENT], round_idx=1)
    assert rec["acc_personalized"] != rec["acc"] or rec["loss_personalized"] != rec["loss"]
    assert np.array_equal(with_eval.personal[CLIENT], personal)
    [a] = with_eval.train(u1.shared, [CLIENT], round_idx=2)
    [b] = without.train(u1.shared, [CLIENT], round_idx=2)
    assert np.array_equal(a.shared, b.shared) and np.array_equal(with_eval.personal[CLIENT], without.personal[CLIENT])


@pytest.mark.parametrize("part", ["head", "body", "full"])
def test_finetune_part_updates_only_that_part(data_root, part):
    rt = runtime(data_root, "fedavg")
    rt.cfg.eval.finetune_part = part
    g = global0(rt)
    rt._load_for_eval(g, CLIENT)
    before = {k: v.detach().clone() for k, v in rt.net.named_parameters()}
    rt.evaluate(g, [CLIENT], round_idx=1)  # leaves the fine-tuned copy loaded in the model
    changed = {k for k, v in rt.net.named_parameters() if not torch.equal(v, before[k])}
    head = {k for k in changed if k.startswith("classifier.")}
    assert bool(head) == (part in ("head", "full"))
    assert bool(changed - head) == (part in ("body", "full"))


class LabelSmoothingClient(FedClient):
    """A user's own LightningModule: same contract, different loss."""

    def training_step(self, batch, batch_idx):
        self.smoothed_steps = getattr(self, "smoothed_steps", 0) + 1
        x, y = batch
        opts = [o for p, o in zip(self.optimized_parts, self._as_list(self.optimizers())) if p in self.trainable]
        loss = torch.nn.functional.cross_entropy(self(x), y, label_smoothing=0.1)
        for o in opts:
            o.zero_grad()
        self.manual_backward(loss)
        for o in opts:
            o.step()
        return loss.detach()


def test_a_users_own_lightning_module_plugs_in(data_root):
    cfg = validate({"data": {"root": str(data_root), "num_clients": 5, "k": 2, "train_fraction": 0.01,
                             "test_fraction": 0.02},
                    "model": {"client": "test_algorithms:LabelSmoothingClient"}, "train": {"local_epochs": 1}})
    data = load_dataset("cifar10", data_root)
    part = make_partition("classes", data.train_y, data.test_y, 5, 0, k=2, train_fraction=0.01, test_fraction=0.02)
    rt = ClientRuntime(cfg.model_dump(), {c: ClientData(part.train[c], part.test[c]) for c in range(5)})
    assert isinstance(rt.client_module, LabelSmoothingClient)
    rt.train(global0(rt), [CLIENT], round_idx=1)
    assert rt.client_module.smoothed_steps > 0
    with pytest.raises(ConfigError, match="model.client: cannot import"):
        load_client_class("nowhere.module:Nothing")
