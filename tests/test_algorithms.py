"""Each algorithm's defining property, checked on a worker runtime with real CIFAR-10 data (no Ray)."""
import hashlib
import json

import numpy as np
import pytest
import torch
from conftest import TESTS, client_runtime

from fedsim.algorithms import ALGORITHMS, WEIGHTS, build_algorithm
from fedsim.client import FedClient
from fedsim.config import ConfigError, OptimConfig, validate
from fedsim.data import load_dataset, make_partition
from fedsim.engine.aggregate import weighted_average
from fedsim.engine.server import sample_clients

CLIENT = 2


def start(rt) -> dict:
    """The server state of round 0, as the server builds it."""
    weights = rt.layouts["shared"].pack(rt.net)
    return {WEIGHTS: weights, **{n: np.zeros_like(weights) for n in rt.algorithm.server_slots}}


def server_round(rt, state, updates, num_clients=5):
    """What the server does with a round's updates: average each upload, then the algorithm's hook."""
    means = {}
    for name, weighting in rt.algorithm.uploads.items():
        uniform = (weighting or rt.cfg.train.weighting) == "uniform"
        means[name] = weighted_average([(u.client, 1 if uniform else u.n_train, u.uploads[name]) for u in updates],
                                       as_float32=False)
    rt.algorithm.server_update(state, means, len(updates), num_clients)
    return state


def test_every_algorithm_trains_and_evaluates(data_root):
    for name in sorted(ALGORITHMS):
        rt = client_runtime(data_root, name)
        state = start(rt)
        [u] = rt.train(state, [CLIENT], round_idx=1)
        assert np.isfinite(u.train_loss) and set(u.uploads) == set(rt.algorithm.uploads), name
        assert all(v.shape == (rt.layouts["shared"].size,) for v in u.uploads.values()), name
        [rec] = rt.evaluate(server_round(rt, state, [u]), [CLIENT], round_idx=1)
        assert 0 <= rec["acc"] <= 1 and 0 <= rec["acc_personalized"] <= 1, name


@pytest.mark.parametrize("name", ["fedavg", "fedper", "fedbabu"])
def test_results_unchanged_since_the_refactor(data_root, name):
    """The rounds of tests/data/golden_dae5d9e.json, recorded with the engine before algorithms became code
    units (commit dae5d9e), under the options that reproduce its behaviour: weight decay 5e-4 in training
    and fine-tuning (then the default). Every float compared bit for bit."""
    wd = {"weight_decay": 5e-4}
    cfg = validate({"seed": 5, "algorithm": name,
                    "data": {"root": str(data_root), "num_clients": 6, "partition": "classes", "k": 3,
                             "train_fraction": 0.02, "test_fraction": 0.05},
                    "train": {"local_epochs": 1, "batch_size": 20, "fraction": 0.5, "rounds": 3, "body": wd, "head": wd},
                    "eval": {"finetune_epochs": 1, "finetune_weight_decay": 5e-4}})
    from fedsim.client.runtime import ClientRuntime
    from fedsim.engine.protocol import ClientData

    data = load_dataset("cifar10", data_root)
    part = make_partition("classes", data.train_y, data.test_y, 6, 5, k=3, train_fraction=0.02, test_fraction=0.05)
    rt = ClientRuntime(cfg.model_dump(), {c: ClientData(part.train[c], part.test[c]) for c in range(6)})
    state, rounds = start(rt), []
    for r in (1, 2, 3):
        updates = rt.train(state, sample_clients(5, r, 6, 0.5), r)
        if state[WEIGHTS].size:
            server_round(rt, state, updates, 6)
        records = rt.evaluate(state, list(range(6)), r)
        rounds.append({"round": r, "train_loss": [float(u.train_loss).hex() for u in updates],
                       "global": hashlib.sha256(state[WEIGHTS].tobytes()).hexdigest(),
                       "records": [{k: float(v).hex() if isinstance(v, float) else v for k, v in rec.items()}
                                   for rec in records]})
    assert rounds == json.loads((TESTS / "data" / "golden_dae5d9e.json").read_text())[name]


def test_fedbabu_head_is_orthogonal_fixed_and_the_same_everywhere(data_root):
    rt = client_runtime(data_root, "fedbabu")
    w = rt.net.output_layer.weight.detach()
    torch.testing.assert_close(w @ w.T, torch.eye(w.shape[0]), atol=1e-5, rtol=0)
    head_before = rt.initial["personal"].copy()
    state = start(rt)
    for r in (1, 2):
        [u] = rt.train(state, [CLIENT], round_idx=r)
        state[WEIGHTS] = u.uploads[WEIGHTS]
    assert np.array_equal(rt.slots["personal"][CLIENT], head_before)  # bit-identical after training
    assert not np.array_equal(state[WEIGHTS], start(client_runtime(data_root, "fedbabu"))[WEIGHTS])  # the body trained
    assert np.array_equal(client_runtime(data_root, "fedbabu").initial["personal"], head_before)  # built from the seed
    # The authors' main_fed.py head: nn.Linear's own init, drawn from the seed exactly as FedAvg's is.
    linear = client_runtime(data_root, {"name": "fedbabu", "head_init": "linear"})
    fedavg = client_runtime(data_root, "fedavg")
    assert torch.equal(linear.net.output_layer.weight, fedavg.net.output_layer.weight)


def test_fedbabu_not_orthogonal_head_has_unit_rows_pointing_almost_the_same_way(data_root):
    """App. Q's ablation head: the rows are unit vectors with pairwise cosine near 1 (main_single.py's draw)."""
    rt = client_runtime(data_root, {"name": "fedbabu", "head_init": "not_orthogonal"})
    w = rt.net.output_layer.weight.detach()
    cosines = w @ w.T
    torch.testing.assert_close(torch.diagonal(cosines), torch.ones(w.shape[0]), atol=1e-6, rtol=0)
    assert cosines.min() > 0.99 and not torch.any(rt.net.output_layer.bias)
    head_before = rt.initial["personal"].copy()
    [u] = rt.train(start(rt), [CLIENT], round_idx=1)
    assert np.array_equal(rt.slots["personal"][CLIENT], head_before)  # still fixed while the body trains


def test_fedper_keeps_its_personal_layers_unless_told_to_discard_them_as_the_fedbabu_authors_code(data_root):
    """The paper's FedPer carries each client's head into its next round; the FedBABU authors' main_fed.py
    trains it and then drops it, so every round (and the fine-tuning at evaluation) starts from the initial head."""
    kept, dropped = client_runtime(data_root, "fedper"), client_runtime(data_root, {"name": "fedper",
                                                                                    "keep_personal": False})
    state = start(kept)
    [k1], [d1] = kept.train(state, [CLIENT], round_idx=1), dropped.train(state, [CLIENT], round_idx=1)
    assert np.array_equal(k1.uploads[WEIGHTS], d1.uploads[WEIGHTS])  # the same first round
    assert not np.array_equal(kept.slots["personal"][CLIENT], kept.initial["personal"])
    assert CLIENT not in dropped.slots["personal"]
    [k2], [d2] = kept.train(state, [CLIENT], round_idx=1), dropped.train(state, [CLIENT], round_idx=1)
    assert np.array_equal(d2.uploads[WEIGHTS], d1.uploads[WEIGHTS])  # again from the initial head
    assert not np.array_equal(k2.uploads[WEIGHTS], k1.uploads[WEIGHTS])  # from its own trained head


def test_lg_fedavg_never_sends_the_body(data_root):
    rt = client_runtime(data_root, "lg_fedavg")
    assert rt.layouts["shared"].keys and all(k.startswith("classifier.") for k in rt.layouts["shared"].keys)
    assert not any(k.startswith("classifier.") for k in rt.layouts["personal"].keys)
    [u] = rt.train(start(rt), [CLIENT], round_idx=1)
    assert u.uploads[WEIGHTS].size == rt.net.output_layer.weight.numel() + rt.net.output_layer.bias.numel()


def _phases(rt) -> list[str]:
    """Which part trained at each step: recorded from the optimizers the runtime activates."""
    by_optimizer = {id(o): part for part, o in rt.optimizers["train"].items()}
    seen, step = [], rt.client_module.training_step

    def spy(batch, idx):
        seen.append("+".join(by_optimizer[id(o)] for o in rt.client_module.active_optimizers))
        return step(batch, idx)

    rt.client_module.training_step = rt.module.training_step = spy
    return seen


def test_fedrep_trains_the_head_for_its_epochs_then_the_body(data_root):
    rt = client_runtime(data_root, {"name": "fedrep", "head_epochs": 3, "body_epochs": 2})
    seen = _phases(rt)
    rt.train(start(rt), [CLIENT], round_idx=1)
    per_epoch = -(-len(rt.client_data[CLIENT].train) // 25)
    assert seen == ["head"] * (3 * per_epoch) + ["body"] * (2 * per_epoch)
    assert ALGORITHMS["fedrep"].Params().head_epochs == 10  # the FedRep paper's 10 head epochs, 1 body epoch


def test_fedper_pre_finetuning_trains_the_head_alone_then_everything(data_root):
    rt = client_runtime(data_root, {"name": "fedper_ft", "head_epochs": 2}, train__local_epochs=1)
    seen = _phases(rt)
    rt.train(start(rt), [CLIENT], round_idx=1)
    per_epoch = -(-len(rt.client_data[CLIENT].train) // 25)
    assert seen == ["head"] * (2 * per_epoch) + ["body+head"] * per_epoch


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(data_root):
    avg = client_runtime(data_root, "fedavg")
    prox0 = client_runtime(data_root, {"name": "fedprox", "mu": 0.0})
    prox = client_runtime(data_root, {"name": "fedprox", "mu": 1.0})
    g = start(avg)
    [a], [p0], [p] = (rt.train(g, [CLIENT], round_idx=1) for rt in (avg, prox0, prox))
    assert np.array_equal(a.uploads[WEIGHTS], p0.uploads[WEIGHTS])
    # A real mu pulls the update toward the global weights.
    assert np.linalg.norm(p.uploads[WEIGHTS] - g[WEIGHTS]) < np.linalg.norm(a.uploads[WEIGHTS] - g[WEIGHTS])


def test_ditto_personal_model_moves_toward_global_as_lambda_grows(data_root):
    dist = {}
    for lam in (0.0, 5.0, 50.0):
        rt = client_runtime(data_root, {"name": "ditto", "lambda": lam}, train__local_epochs=2)
        g = start(rt)
        [u] = rt.train(g, [CLIENT], round_idx=1)
        personal = rt.slots["personal_model"][CLIENT]
        assert not np.array_equal(personal, u.uploads[WEIGHTS])  # the personal model is not the global update
        # Distance over parameters only: BatchNorm running statistics are not regularised.
        mask = rt.learning_rates("full", 1) > 0
        dist[lam] = float(np.linalg.norm((personal - g[WEIGHTS])[mask]))
    assert dist[50.0] < dist[5.0] < dist[0.0]


def _two_rounds(data_root, algorithm, num_clients=5):
    rt = client_runtime(data_root, algorithm)
    state, globals_ = start(rt), []
    for r in (1, 2):
        server_round(rt, state, rt.train(state, [0, CLIENT, 4], round_idx=r), num_clients)
        globals_.append(state[WEIGHTS].copy())
    return rt, state, globals_


def test_fedavgm_with_momentum_zero_is_fedavg_bit_for_bit(data_root):
    _, _, fedavg = _two_rounds(data_root, "fedavg")
    _, _, plain = _two_rounds(data_root, {"name": "fedavgm", "momentum": 0.0})
    _, state, heavy = _two_rounds(data_root, {"name": "fedavgm", "momentum": 0.9})
    assert all(np.array_equal(a, b) for a, b in zip(fedavg, plain))
    assert np.array_equal(heavy[0], fedavg[0])  # round 1: no momentum yet
    assert not np.array_equal(heavy[1], fedavg[1]) and np.abs(state["momentum"]).max() > 0


def test_fedadam_steps_by_the_normalised_average(data_root):
    rt = client_runtime(data_root, "fedadam")
    state = start(rt)
    weights = state[WEIGHTS].astype(np.float64)
    updates = rt.train(state, [0, CLIENT, 4], round_idx=1)
    avg = weighted_average([(u.client, u.n_train, u.uploads[WEIGHTS]) for u in updates], as_float32=False)
    server_round(rt, state, updates)
    p, delta = rt.algorithm.params, avg - weights
    # First step: m = (1 - b1) D, v = (1 - b2) D^2, so each value moves by about eta (1 - b1) / sqrt(1 - b2)
    # whatever the size of its own D: Adam's per-coordinate normalisation.
    expected = weights + p.server_lr * (1 - p.beta1) * delta / (np.sqrt(1 - p.beta2) * np.abs(delta) + p.tau)
    np.testing.assert_allclose(state[WEIGHTS], expected.astype(np.float32), rtol=1e-6, atol=1e-9)
    big = np.abs(delta) > 100 * p.tau
    step = np.abs(state[WEIGHTS].astype(np.float64) - weights)[big]
    assert step.max() < 1.01 * p.server_lr * (1 - p.beta1) / np.sqrt(1 - p.beta2)


def test_scaffold_with_zero_control_variates_is_fedavg_then_corrects_drift(data_root):
    fedavg_rt, _, fedavg = _two_rounds(data_root, "fedavg")
    rt, state, scaffold = _two_rounds(data_root, "scaffold")
    assert np.array_equal(scaffold[0], fedavg[0])  # round 1: c = c_i = 0, so every step is FedAvg's
    assert not np.array_equal(scaffold[1], fedavg[1])  # round 2 is corrected
    # c = sum over rounds of |S|/N x mean(delta c_i); each sampled client's c_i moved, others never did.
    assert all(CLIENT in rt.slots["control"] and 1 not in rt.slots["control"] for _ in [0])
    total = sum(rt.slots["control"][c] for c in (0, CLIENT, 4)) / 5
    np.testing.assert_allclose(state["control"], total, rtol=1e-4, atol=1e-6)
    buffers = rt.learning_rates("shared", 1) == 0  # BatchNorm statistics get no correction
    assert not np.any(state["control"][buffers])


def test_fedbn_keeps_every_batchnorm_layer_on_the_client(data_root):
    rt = client_runtime(data_root, "fedbn")
    bn = [k for k in rt.layouts["full"].keys if k.startswith("blocks.") and k.split(".")[2] == "1"]
    assert bn and set(bn) <= set(rt.layouts["personal"].keys)
    assert not set(bn) & set(rt.layouts["shared"].keys)
    assert any(k.endswith("running_mean") for k in bn)  # statistics too, not only the affine weights
    # The same split for any method with model.batchnorm=personal.
    assert client_runtime(data_root, "fedavg", model__batchnorm="personal").layouts["shared"].keys == \
        rt.layouts["shared"].keys


def test_batch_statistics_mode_has_no_running_statistics(data_root):
    rt = client_runtime(data_root, "fedbabu", model__batchnorm="batch_stats")
    assert not any("running" in k or "num_batches" in k for k in rt.layouts["full"].keys)
    [rec] = rt.evaluate(start(rt), [CLIENT], round_idx=1)
    assert 0 <= rec["acc"] <= 1


def test_apfl_scores_the_mixture_and_learns_alpha(data_root):
    rt = client_runtime(data_root, "apfl")
    state = start(rt)
    [u] = rt.train(state, [CLIENT], round_idx=1)
    alpha = float(rt.slots["alpha"][CLIENT][0])
    assert 0 <= alpha <= 1 and alpha != 0.5  # adaptive: moved from its start
    assert not np.array_equal(rt.slots["personal_model"][CLIENT], rt.initial["full"])
    # alpha = 0 and fixed: the personal model never counts, so scoring is the global model's own.
    frozen = client_runtime(data_root, {"name": "apfl", "alpha": 0.0, "adaptive": False})
    fedavg = client_runtime(data_root, "fedavg")
    frozen.train(state, [CLIENT], round_idx=1)
    assert frozen.evaluate(state, [CLIENT], 1)[0]["acc"] == fedavg.evaluate(state, [CLIENT], 1)[0]["acc"]


def test_evaluation_finetuning_leaves_training_state_untouched(data_root):
    with_eval, without = client_runtime(data_root, "fedper"), client_runtime(data_root, "fedper")
    g = start(with_eval)
    [u1] = with_eval.train(g, [CLIENT], round_idx=1)
    without.train(g, [CLIENT], round_idx=1)
    personal = with_eval.slots["personal"][CLIENT].copy()
    after = {WEIGHTS: u1.uploads[WEIGHTS]}
    [rec] = with_eval.evaluate(after, [CLIENT], round_idx=1)
    assert rec["acc_personalized"] != rec["acc"] or rec["loss_personalized"] != rec["loss"]
    assert np.array_equal(with_eval.slots["personal"][CLIENT], personal)
    [a] = with_eval.train(after, [CLIENT], round_idx=2)
    [b] = without.train(after, [CLIENT], round_idx=2)
    assert np.array_equal(a.uploads[WEIGHTS], b.uploads[WEIGHTS])
    assert np.array_equal(with_eval.slots["personal"][CLIENT], without.slots["personal"][CLIENT])


def test_finetuning_has_its_own_optimizer(data_root):
    from fedsim.client.context import ClientContext

    still = client_runtime(data_root, "fedper", eval__finetune_lr=0.0, eval__finetune_momentum=0.0)
    state = start(still)
    still.algorithm.load_for_evaluation(ClientContext(still, CLIENT, 1, state, torch.Generator()))
    loaded = [p.detach().clone() for p in still.net.parameters()]
    still.evaluate(state, [CLIENT], round_idx=1)  # leaves the fine-tuned copy loaded in the model
    assert all(torch.equal(a, b) for a, b in zip(loaded, still.net.parameters()))  # lr 0: nothing moved
    tuned = client_runtime(data_root, "fedper", eval__finetune_lr=0.05)
    assert tuned.learning_rate("body", 1, finetune=True) == 0.05 and tuned.learning_rate("body", 1) == 0.01
    # By default fine-tuning uses each part's training lr of that round: FedBABU's final, decayed lr.
    decayed = client_runtime(data_root, "fedper", train__body={"lr": 0.1, "schedule": "step"}, train__rounds=4)
    assert decayed.learning_rate("body", 4, finetune=True) == pytest.approx(0.001)


@pytest.mark.parametrize("part", ["head", "body", "full"])
def test_finetune_part_updates_only_that_part(data_root, part):
    rt = client_runtime(data_root, "fedavg", eval__finetune_part=part)
    from fedsim.client.context import ClientContext

    g = start(rt)
    rt.algorithm.load_for_evaluation(ClientContext(rt, CLIENT, 1, g, torch.Generator()))
    before = {k: v.detach().clone() for k, v in rt.net.named_parameters()}
    rt.evaluate(g, [CLIENT], round_idx=1)  # leaves the fine-tuned copy loaded in the model
    changed = {k for k, v in rt.net.named_parameters() if not torch.equal(v, before[k])}
    head = {k for k in changed if k.startswith("classifier.")}
    assert bool(head) == (part in ("head", "full"))
    assert bool(changed - head) == (part in ("body", "full"))


def test_step_schedule_follows_fedbabus_milestones():
    step = OptimConfig(lr=0.1, schedule="step")
    # main_fed.py: x0.1 once the 0-based round reaches rounds//2 and 3*rounds//4.
    assert [step.lr_at(r, 8) for r in (1, 4, 5, 6, 7, 8)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    assert OptimConfig(lr=0.1).lr_at(8, 8) == 0.1


def test_uniform_weighting_ignores_sample_counts(data_root):
    from fedsim.engine.protocol import ClientUpdate

    updates = [ClientUpdate(c, n, {WEIGHTS: np.full(4, v, np.float32)}, 0.0, 0) for c, n, v in ((0, 10, 1.0), (1, 30, 3.0))]
    for weighting, expected in (("uniform", 2.0), ("samples", 2.5)):
        rt = client_runtime(data_root, "fedavg", train__weighting=weighting)
        state = server_round(rt, {WEIGHTS: np.zeros(4, np.float32)}, updates)
        assert state[WEIGHTS].tolist() == [expected] * 4


def test_method_parameters_are_typed_and_named():
    assert validate({"algorithm": {"name": "fedprox", "mu": 0.5}}).algorithm.params == {"mu": 0.5}
    assert validate({"algorithm": "fedprox"}).algorithm.params == {"mu": 0.01}  # defaults filled in
    assert validate({"algorithm": {"name": "ditto", "lambda": 2}}).algorithm.params["lambda"] == 2
    for bad, field in (({"name": "fedprox", "mu": -1}, "algorithm.mu"), ({"name": "fedprox", "lam": 1}, "algorithm.lam"),
                       ({"name": "fedavg", "mu": 1}, "algorithm.mu")):
        with pytest.raises(ConfigError, match=field):
            from fedsim.config import validate as v
            try:
                v({"algorithm": bad})
            except ConfigError as err:
                assert "\n" not in str(err)
                raise
    with pytest.raises(ConfigError, match="train.mu: moved to the method's own parameters"):
        validate({"train": {"mu": 0.1}})
    assert build_algorithm(validate({"algorithm": {"name": "fedrep", "head_epochs": 2}})).params.head_epochs == 2


class LabelSmoothingClient(FedClient):
    """A user's own LightningModule: the same contract with another loss."""

    def loss(self, batch):
        self.smoothed_steps = getattr(self, "smoothed_steps", 0) + 1
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y, label_smoothing=0.1)


def test_a_users_own_loss_keeps_the_algorithms_penalty(data_root):
    from fedsim.client.runtime import load_client_class

    own = {"model__client": "test_algorithms:LabelSmoothingClient"}
    plain = client_runtime(data_root, {"name": "fedprox", "mu": 0.0}, **own)
    pulled = client_runtime(data_root, {"name": "fedprox", "mu": 5.0}, **own)
    assert isinstance(plain.client_module, LabelSmoothingClient)
    g = start(plain)
    [a], [b] = plain.train(g, [CLIENT], 1), pulled.train(g, [CLIENT], 1)
    assert plain.client_module.smoothed_steps > 0 and pulled.client_module.smoothed_steps > 0
    # FedProx's pull still acts on the user's loss.
    assert np.linalg.norm(b.uploads[WEIGHTS] - g[WEIGHTS]) < np.linalg.norm(a.uploads[WEIGHTS] - g[WEIGHTS])
    with pytest.raises(ConfigError, match="model.client: cannot import"):
        load_client_class("nowhere.module:Nothing")


def test_readme_algorithm_table_is_generated_from_the_code():
    from fedsim.algorithms.catalog import markdown_table

    readme = (TESTS.parent / "README.md").read_text()
    assert markdown_table() in readme, "README's algorithm table is stale: paste `fedsim algorithms --markdown`"


def test_fedyogi_second_moment_moves_additively(data_root):
    rt = client_runtime(data_root, "fedyogi")
    state = start(rt)
    state["v"] = np.full_like(state["v"], 1e-6)
    weights = state[WEIGHTS].astype(np.float64)
    updates = rt.train(state, [0, CLIENT], round_idx=1)
    avg = weighted_average([(u.client, u.n_train, u.uploads[WEIGHTS]) for u in updates], as_float32=False)
    server_round(rt, state, updates)
    squared = (avg - weights) ** 2
    # Yogi: v - (1 - b2) D^2 sign(v - D^2); from a small v it grows by exactly (1 - b2) D^2 (Adam would decay it).
    expected = 1e-6 + (1 - rt.algorithm.params.beta2) * squared * (squared > 1e-6) - \
        (1 - rt.algorithm.params.beta2) * squared * (squared < 1e-6)
    np.testing.assert_allclose(state["v"], expected.astype(np.float32), rtol=1e-5, atol=1e-12)


def test_every_experiment_config_validates():
    from fedsim.config import expand_sweep, load_tree

    for path in sorted((TESTS.parent / "experiments").glob("*.yaml")):
        assert expand_sweep(load_tree(path)), path


def test_adam_is_an_optimizer_choice_per_part(data_root):
    rt = client_runtime(data_root, "fedper", train__body={"optimizer": "adam", "lr": 1e-3})
    assert isinstance(rt.optimizers["train"]["body"], torch.optim.Adam)
    assert isinstance(rt.optimizers["train"]["head"], torch.optim.SGD)
    assert isinstance(rt.optimizers["finetune"]["body"], torch.optim.SGD)  # FedBABU fine-tunes with SGD
    [u] = rt.train(start(rt), [CLIENT], round_idx=1)
    assert np.isfinite(u.train_loss)
