"""Each algorithm's defining property, checked through the engine's own paths on the synthetic data set (no
real data needed): rounds through the in-process server (the real Server over in-process workers), and one
client's round through the runtime's ``train_client``, the step ``train_and_sum`` runs for every client."""
import hashlib
import json

import numpy as np
import pytest
import torch
from conftest import TESTS, in_process_server, plan_for, synthetic_tree, train_one

from fedsim.algorithms import ALGORITHMS, WEIGHTS, build_algorithm
from fedsim.algorithms.context import ClientContext
from fedsim.client.randomness import FINETUNE_STREAM, client_generator
from fedsim.client.runtime import ClientRuntime
from fedsim.client.settings import OptimizerSettings
from fedsim.config import OptimConfig, validate
from fedsim.core.aggregate import weighted_average
from fedsim.errors import ConfigError
from fedsim.models.lightning import load_client_class, part_parameters

CLIENT = 2
BN_NET = {"model__name": "user_plugins:bn_net"}  # an MLP with BatchNorm, for the methods that treat it apart
QUICK = {"fedrep": {"head_epochs": 2}}  # the default 10 head epochs test nothing more, slowly


def config(tmp_path, algorithm, **over):
    return validate(synthetic_tree(tmp_path, algorithm=algorithm, **over))


def started(monkeypatch, tmp_path, algorithm, **over):
    """The real server over two in-process workers, at round 0."""
    server = in_process_server(config(tmp_path, algorithm, **over))
    server.restore(None)
    return server


def runtime(tmp_path, algorithm, **over) -> ClientRuntime:
    """One worker's runtime holding every client of the synthetic run."""
    plan = plan_for(config(tmp_path, algorithm, **over))
    return ClientRuntime(plan, dict(enumerate(plan.clients)))


def start(rt: ClientRuntime) -> dict:
    """The server's round-0 broadcast."""
    return {WEIGHTS: rt.plan.model.initial["shared"]}


def owner(server, client: int) -> ClientRuntime:
    """The runtime holding ``client``'s state."""
    return server.pool.workers[server.owner.get(client, 0)].runtime


def globals_over(server, rounds: int) -> list[np.ndarray]:
    out = []
    for r in range(1, rounds + 1):
        server.round(r)
        out.append(server.state[WEIGHTS].copy())
    return out


def spy_server_hook(server) -> list[dict]:
    """What the method's server hook is handed, call by call (one per tensor): the averaged uploads and the
    state before the hook folded them in."""
    seen, hook = [], server.algorithm.server_update

    def spy(state, means, sampled, num_clients):
        seen.append({"before": {k: v.astype(np.float64) for k, v in state.items()},
                     "means": {k: v.copy() for k, v in means.items()}})
        hook(state, means, sampled, num_clients)

    server.algorithm.server_update = spy
    return seen


def whole(calls: list[dict]) -> dict:
    """One round's per-tensor hook calls joined into whole vectors (the calls go in layout order)."""
    return {part: {k: np.concatenate([c[part][k] for c in calls]) for k in calls[0][part]}
            for part in ("before", "means")}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_trains_aggregates_and_evaluates(tmp_path, monkeypatch, name):
    server = started(monkeypatch, tmp_path, {"name": name, **QUICK.get(name, {})}, train__rounds=1)
    initial = server.state[WEIGHTS].copy()
    result = server.round(1)
    assert not result.dropped and len(result.sampled) == 4
    assert [r["client"] for r in result.records] == list(range(8))
    assert all(0 <= r["acc"] <= 1 and 0 <= r["acc_personalized"] <= 1 for r in result.records)
    assert all(np.isfinite(r["train_loss"]) for r in result.records if r["client"] in result.sampled)
    assert server.state[WEIGHTS].shape == initial.shape and np.all(np.isfinite(server.state[WEIGHTS]))
    assert initial.size == 0 or not np.array_equal(server.state[WEIGHTS], initial)  # what is shared moved


# The same rounds recorded on two kinds of CPU: float kernels differ by instruction set (AVX2 vs AVX-512), so a
# machine reproduces one of them bit for bit. The second was recorded on an AVX-512 machine with commit 2b4bef0,
# whose code reproduces the first on the machine that recorded it.
GOLDENS = (TESTS / "data" / "golden_dae5d9e.json", TESTS / "data" / "golden_dae5d9e_avx512.json")


@pytest.mark.parametrize("name", ["fedavg", "fedper", "fedbabu"])
def test_results_unchanged_since_the_refactor(data_root, name):
    """The rounds of tests/data/golden_dae5d9e.json, recorded with the engine before algorithms became code
    units (commit dae5d9e), under the options that reproduce its behaviour: weight decay 5e-4 in training
    and fine-tuning (then the default). Every float compared bit for bit. That engine averaged in float64,
    so here each client's round is the runtime's own ``train_client`` and the server's average the float64
    reference (``weighted_average``, against which tests/test_aggregation.py checks the exact sums)."""
    wd = {"weight_decay": 5e-4}
    cfg = validate({"seed": 5, "algorithm": name,
                    "data": {"root": str(data_root), "num_clients": 6, "partition": "classes", "k": 3,
                             "train_fraction": 0.02, "test_fraction": 0.05},
                    "train": {"local_epochs": 1, "batch_size": 20, "fraction": 0.5, "rounds": 3, "body": wd, "head": wd},
                    "eval": {"finetune_epochs": 1, "finetune_weight_decay": 5e-4}})
    plan = plan_for(cfg)
    rt = ClientRuntime(plan, dict(enumerate(plan.clients)))
    state, rounds = start(rt), []
    for r in (1, 2, 3):
        sampled = plan.sampled(r)
        trained = [(c, *train_one(rt, state, c, r)) for c in sampled]
        if state[WEIGHTS].size:
            average = weighted_average([(c, plan.train_sizes[c], uploads[WEIGHTS]) for c, uploads, _ in trained],
                                       as_float32=False)
            plan.algorithm.server_update(state, {WEIGHTS: average}, len(sampled), 6)
        records = rt.evaluate(state, list(range(6)), r)
        rounds.append({"round": r, "train_loss": [loss.hex() for _, _, loss in trained],
                       "global": hashlib.sha256(state[WEIGHTS].tobytes()).hexdigest(),
                       "records": [{k: float(v).hex() if isinstance(v, float) else v for k, v in rec.items()}
                                   for rec in records]})
    assert rounds in [json.loads(path.read_text())[name] for path in GOLDENS]


def _classifier(plan) -> np.ndarray:
    return plan.model.layouts["full"].arrays(plan.model.initial["full"])["classifier.weight"]


def test_fedbabu_head_is_orthogonal_fixed_and_the_same_everywhere(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedbabu")
    w = torch.from_numpy(_classifier(server.plan))
    torch.testing.assert_close(w @ w.T, torch.eye(w.shape[0]), atol=1e-5, rtol=0)
    head = server.plan.model.initial["personal"]
    sampled = {c for r in (1, 2) for c in server.round(r).sampled}
    for client in sampled:  # trained twice at most, its head bit-identical to the one it started with
        assert np.array_equal(owner(server, client).slots["personal"][client], head)
    assert not np.array_equal(server.state[WEIGHTS], server.plan.model.initial["shared"])  # the body trained
    assert np.array_equal(plan_for(server.cfg).model.initial["personal"], head)  # built from the seed
    # The authors' main_fed.py head: nn.Linear's own init, drawn from the seed exactly as FedAvg's is.
    linear = plan_for(config(tmp_path, {"name": "fedbabu", "head_init": "linear"}))
    assert np.array_equal(_classifier(linear), _classifier(plan_for(config(tmp_path, "fedavg"))))


def test_fedbabu_not_orthogonal_head_has_unit_rows_pointing_almost_the_same_way(tmp_path, monkeypatch):
    """App. Q's ablation head: the rows are unit vectors with pairwise cosine near 1 (main_single.py's draw)."""
    server = started(monkeypatch, tmp_path, {"name": "fedbabu", "head_init": "not_orthogonal"})
    w = torch.from_numpy(_classifier(server.plan))
    cosines = w @ w.T
    torch.testing.assert_close(torch.diagonal(cosines), torch.ones(w.shape[0]), atol=1e-6, rtol=0)
    bias = server.plan.model.layouts["full"].arrays(server.plan.model.initial["full"])["classifier.bias"]
    assert cosines.min() > 0.99 and not bias.any()
    for client in server.round(1).sampled:  # still fixed while the body trains
        assert np.array_equal(owner(server, client).slots["personal"][client], server.plan.model.initial["personal"])


def test_fedper_keeps_its_personal_layers_unless_told_to_discard_them_as_the_fedbabu_authors_code(tmp_path):
    """The paper's FedPer carries each client's head into its next round; the FedBABU authors' main_fed.py
    trains it and then drops it, so every round (and the fine-tuning at evaluation) starts from the initial head."""
    kept, dropped = runtime(tmp_path, "fedper"), runtime(tmp_path, {"name": "fedper", "keep_personal": False})
    state = start(kept)
    (k1, _), (d1, _) = train_one(kept, state, CLIENT, 1), train_one(dropped, state, CLIENT, 1)
    assert np.array_equal(k1[WEIGHTS], d1[WEIGHTS])  # the same first round
    assert not np.array_equal(kept.slots["personal"][CLIENT], kept.initial("personal"))
    assert CLIENT not in dropped.slots["personal"]
    (k2, _), (d2, _) = train_one(kept, state, CLIENT, 1), train_one(dropped, state, CLIENT, 1)
    assert np.array_equal(d2[WEIGHTS], d1[WEIGHTS])  # again from the initial head
    assert not np.array_equal(k2[WEIGHTS], k1[WEIGHTS])  # from its own trained head


def test_lg_fedavg_never_sends_the_body(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "lg_fedavg")
    layouts = server.plan.model.layouts
    assert layouts["shared"].keys == ("classifier.weight", "classifier.bias")
    assert not any(k.startswith("classifier.") for k in layouts["personal"].keys)
    sampled = server.round(1).sampled
    assert server.state[WEIGHTS].size == 64 * 10 + 10  # the MLP's Linear(64, 10), nothing of the body
    for client in sampled:  # each trained its own body, which stayed on its worker
        assert not np.array_equal(owner(server, client).slots["personal"][client], server.plan.model.initial["personal"])


def _phases(rt: ClientRuntime) -> list[str]:
    """Which part trained at each step: the parts whose parameters the runtime left trainable."""
    params = part_parameters(rt.loop.module, rt.plan.model.keys)
    seen, step = [], rt.loop.module.training_step

    def spy(batch, idx):
        seen.append("+".join(part for part in ("body", "head") if all(p.requires_grad for p in params[part])))
        return step(batch, idx)

    rt.loop.module.training_step = spy
    return seen


def test_fedrep_trains_the_head_for_its_epochs_then_the_body(tmp_path):
    rt = runtime(tmp_path, {"name": "fedrep", "head_epochs": 3, "body_epochs": 2})
    seen = _phases(rt)
    train_one(rt, start(rt), CLIENT, 1)
    per_epoch = -(-rt.plan.train_sizes[CLIENT] // 10)
    assert seen == ["head"] * (3 * per_epoch) + ["body"] * (2 * per_epoch)
    assert ALGORITHMS["fedrep"].Params().head_epochs == 10  # the FedRep paper's 10 head epochs, 1 body epoch


def test_fedper_pre_finetuning_trains_the_head_alone_then_everything(tmp_path):
    rt = runtime(tmp_path, {"name": "fedper_ft", "head_epochs": 2}, train__local_epochs=1)
    seen = _phases(rt)
    train_one(rt, start(rt), CLIENT, 1)
    per_epoch = -(-rt.plan.train_sizes[CLIENT] // 10)
    assert seen == ["head"] * (2 * per_epoch) + ["body+head"] * per_epoch


def test_fedprox_with_mu_zero_is_fedavg_bit_for_bit(tmp_path, monkeypatch):
    avg, prox0, prox = (globals_over(started(monkeypatch, tmp_path, algorithm), 2)
                        for algorithm in ("fedavg", {"name": "fedprox", "mu": 0.0}, {"name": "fedprox", "mu": 1.0}))
    assert all(np.array_equal(a, b) for a, b in zip(avg, prox0))
    # A real mu pulls every update, and so their average, toward the global weights.
    initial = plan_for(config(tmp_path, "fedavg")).model.initial["shared"]
    assert np.linalg.norm(prox[0] - initial) < np.linalg.norm(avg[0] - initial)


def test_ditto_personal_model_moves_toward_global_as_lambda_grows(tmp_path):
    dist = {}
    for lam in (0.0, 5.0, 50.0):
        rt = runtime(tmp_path, {"name": "ditto", "lambda": lam}, train__local_epochs=2)
        g = start(rt)
        uploads, _ = train_one(rt, g, CLIENT, 1)
        personal = rt.slots["personal_model"][CLIENT]
        assert not np.array_equal(personal, uploads[WEIGHTS])  # the personal model is not the global update
        dist[lam] = float(np.linalg.norm(personal - g[WEIGHTS]))
    assert dist[50.0] < dist[5.0] < dist[0.0]


def test_fedavgm_with_momentum_zero_is_fedavg_bit_for_bit(tmp_path, monkeypatch):
    fedavg = globals_over(started(monkeypatch, tmp_path, "fedavg"), 2)
    plain = globals_over(started(monkeypatch, tmp_path, {"name": "fedavgm", "momentum": 0.0}), 2)
    server = started(monkeypatch, tmp_path, {"name": "fedavgm", "momentum": 0.9})
    heavy = globals_over(server, 2)
    assert all(np.array_equal(a, b) for a, b in zip(fedavg, plain))
    assert np.array_equal(heavy[0], fedavg[0])  # round 1: no momentum yet
    assert not np.array_equal(heavy[1], fedavg[1]) and np.abs(server.state["momentum"]).max() > 0


def test_fedadam_steps_by_the_normalised_average(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedadam")
    calls = spy_server_hook(server)
    server.round(1)
    seen = whole(calls)
    p, weights = server.algorithm.params, seen["before"][WEIGHTS]
    delta = seen["means"][WEIGHTS] - weights
    # First step: m = (1 - b1) D, v = (1 - b2) D^2, so each value moves by about eta (1 - b1) / sqrt(1 - b2)
    # whatever the size of its own D: Adam's per-coordinate normalisation.
    expected = weights + p.server_lr * (1 - p.beta1) * delta / (np.sqrt(1 - p.beta2) * np.abs(delta) + p.tau)
    np.testing.assert_allclose(server.state[WEIGHTS], expected.astype(np.float32), rtol=1e-6, atol=1e-9)
    big = np.abs(delta) > 100 * p.tau
    step = np.abs(server.state[WEIGHTS].astype(np.float64) - weights)[big]
    assert big.any() and step.max() < 1.01 * p.server_lr * (1 - p.beta1) / np.sqrt(1 - p.beta2)


def test_fedyogi_second_moment_moves_additively(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedyogi")
    server.state["v"] = np.full_like(server.state["v"], 1e-6)
    calls = spy_server_hook(server)
    server.round(1)
    seen = whole(calls)
    squared = (seen["means"][WEIGHTS] - seen["before"][WEIGHTS]) ** 2
    b2 = server.algorithm.params.beta2
    # Yogi: v - (1 - b2) D^2 sign(v - D^2); from a small v it grows by exactly (1 - b2) D^2 (Adam would decay it).
    expected = 1e-6 + (1 - b2) * squared * (squared > 1e-6) - (1 - b2) * squared * (squared < 1e-6)
    np.testing.assert_allclose(server.state["v"], expected.astype(np.float32), rtol=1e-5, atol=1e-12)


def test_scaffold_with_zero_control_variates_is_fedavg_then_corrects_drift(tmp_path, monkeypatch):
    fedavg = globals_over(started(monkeypatch, tmp_path, "fedavg", **BN_NET), 2)
    server = started(monkeypatch, tmp_path, "scaffold", **BN_NET)
    scaffold = globals_over(server, 2)
    assert np.array_equal(scaffold[0], fedavg[0])  # round 1: c = c_i = 0, so every step is FedAvg's
    assert not np.array_equal(scaffold[1], fedavg[1])  # round 2 is corrected
    # c = sum over rounds of |S|/N x mean(delta c_i) = (sum of every client's c_i) / N; unsampled ones are 0.
    sampled = set(server.plan.sampled(1)) | set(server.plan.sampled(2))
    controls = {c: owner(server, c).slots["control"][c] for c in sampled}
    assert all(c not in owner(server, c).slots["control"] for c in set(range(8)) - sampled)
    np.testing.assert_allclose(server.state["control"], sum(controls.values()) / 8, rtol=1e-4, atol=1e-6)
    buffers = owner(server, 0).learning_rates("shared", 1) == 0  # BatchNorm statistics get no correction
    assert buffers.any() and not np.any(server.state["control"][buffers])


def test_fedbn_keeps_every_batchnorm_layer_on_the_client(tmp_path):
    layouts = plan_for(config(tmp_path, "fedbn", **BN_NET)).model.layouts
    bn = [k for k in layouts["full"].keys if k.startswith("blocks.") and k.split(".")[2] == "1"]
    assert bn and set(bn) <= set(layouts["personal"].keys)
    assert not set(bn) & set(layouts["shared"].keys)
    assert any(k.endswith("running_mean") for k in bn)  # statistics too, not only the affine weights
    # The same split for any method with model.batchnorm=personal.
    personal = plan_for(config(tmp_path, "fedavg", model__batchnorm="personal", **BN_NET)).model.layouts
    assert personal["shared"].keys == layouts["shared"].keys


def test_batch_statistics_mode_has_no_running_statistics(tmp_path, monkeypatch):
    server = started(monkeypatch, tmp_path, "fedbabu", model__batchnorm="batch_stats", train__rounds=1, **BN_NET)
    assert not any("running" in k or "num_batches" in k for k in server.plan.model.layouts["full"].keys)
    assert all(0 <= r["acc"] <= 1 for r in server.round(1).records)


def test_apfl_scores_the_mixture_and_learns_alpha(tmp_path):
    rt = runtime(tmp_path, "apfl")
    state = start(rt)
    train_one(rt, state, CLIENT, 1)
    alpha = float(rt.slots["alpha"][CLIENT][0])
    assert 0 <= alpha <= 1 and alpha != 0.5  # adaptive: moved from its start
    assert not np.array_equal(rt.slots["personal_model"][CLIENT], rt.initial("full"))
    # alpha = 0 and fixed: the personal model never counts, so scoring is the global model's own.
    frozen = runtime(tmp_path, {"name": "apfl", "alpha": 0.0, "adaptive": False})
    fedavg = runtime(tmp_path, "fedavg")
    train_one(frozen, state, CLIENT, 1)
    assert frozen.evaluate(state, [CLIENT], 1)[0]["acc"] == fedavg.evaluate(state, [CLIENT], 1)[0]["acc"]


def test_apfl_takes_alphas_first_gradient_where_v_and_w_are_one_model(tmp_path):
    """Algorithm 1 steps w, v and alpha from one iterate. In round 1 v starts as w's initial weights, so the first
    step's alpha gradient <v - w, grad> is exactly 0; mixed with w after its step, it is not (and pushes alpha to
    0 on every batch: APFL then scores as FedAvg)."""
    one_step = runtime(tmp_path, "apfl", train__local_epochs=1, train__batch_size=10_000)
    train_one(one_step, start(one_step), CLIENT, 1)
    assert float(one_step.slots["alpha"][CLIENT][0]) == 0.5  # v stepped (alpha * grad), alpha did not
    assert not np.array_equal(one_step.slots["personal_model"][CLIENT], one_step.initial("full"))


@pytest.mark.parametrize("variant", ["paper", "pfllib", "fedtorch"])
def test_apfl_personal_model_keeps_its_own_batchnorm_statistics_and_the_paper_scores_them_mixed(tmp_path, variant):
    """v is a network of its own (PFLlib's model_per, FedTorch's second model): its training passes move its own
    running statistics, apart from w's; the paper's mixture mixes them as it mixes the weights."""
    rt = runtime(tmp_path, {"name": "apfl", "variant": variant}, **BN_NET)
    state = start(rt)
    uploads, _ = train_one(rt, state, CLIENT, 1)
    stats = next(slice(s, e) for key, _, s, e in rt.layouts["full"].spans() if key.endswith("running_mean"))
    v, initial = rt.slots["personal_model"][CLIENT], rt.initial("full")
    assert not np.array_equal(v[stats], initial[stats])  # v's passes moved its statistics
    w_stats = next(slice(s, e) for key, _, s, e in rt.layouts["shared"].spans() if key.endswith("running_mean"))
    assert not np.allclose(v[stats], uploads[WEIGHTS][w_stats])  # ... apart from w's
    if variant == "paper":
        alpha = float(rt.slots["alpha"][CLIENT][0])
        rt.algorithm.load_for_evaluation(ClientContext(rt, CLIENT, 1, state, torch.Generator()))
        scored = rt.layouts["full"].pack()
        np.testing.assert_allclose(scored[stats], alpha * v[stats] + (1 - alpha) * initial[stats], rtol=1e-5, atol=1e-7)


def assert_nothing_kept(with_eval: ClientRuntime, without: ClientRuntime, after: dict, personal: np.ndarray) -> None:
    """Evaluation left the client's personal state as it was, and its next round trains as without evaluation."""
    assert np.array_equal(with_eval.slots["personal"][CLIENT], personal)
    a, _ = train_one(with_eval, after, CLIENT, 2)
    b, _ = train_one(without, after, CLIENT, 2)
    assert np.array_equal(a[WEIGHTS], b[WEIGHTS])
    assert np.array_equal(with_eval.slots["personal"][CLIENT], without.slots["personal"][CLIENT])


def test_evaluation_finetuning_leaves_training_state_untouched(tmp_path):
    with_eval, without = runtime(tmp_path, "fedper"), runtime(tmp_path, "fedper")
    g = start(with_eval)
    u1, _ = train_one(with_eval, g, CLIENT, 1)
    train_one(without, g, CLIENT, 1)
    personal = with_eval.slots["personal"][CLIENT].copy()
    after = {WEIGHTS: u1[WEIGHTS]}
    [rec] = with_eval.evaluate(after, [CLIENT], round_idx=1)
    assert rec["acc_personalized"] != rec["acc"] or rec["loss_personalized"] != rec["loss"]
    assert_nothing_kept(with_eval, without, after, personal)


def test_finetuning_has_its_own_optimizer(tmp_path):
    still = runtime(tmp_path, "fedper", eval__finetune_lr=0.0, eval__finetune_momentum=0.0)
    state = start(still)
    still.algorithm.load_for_evaluation(ClientContext(still, CLIENT, 1, state, torch.Generator()))
    loaded = [p.detach().clone() for p in still.net.parameters()]
    still.evaluate(state, [CLIENT], round_idx=1)  # leaves the fine-tuned copy loaded in the model
    assert all(torch.equal(a, b) for a, b in zip(loaded, still.net.parameters()))  # lr 0: nothing moved
    tuned = OptimizerSettings(plan_for(config(tmp_path, "fedper", eval__finetune_lr=0.05)).cfg, own_optimizers=False)
    assert tuned.lr("body", 1, finetune=True) == 0.05 and tuned.lr("body", 1) == 0.01
    # By default fine-tuning uses each part's training lr of that round: FedBABU's final, decayed lr.
    decayed = OptimizerSettings(plan_for(config(tmp_path, "fedper", train__body={"lr": 0.1, "schedule": "step"},
                                                train__rounds=4)).cfg, own_optimizers=False)
    assert decayed.lr("body", 4, finetune=True) == pytest.approx(0.001)


OWN_UPDATE = {"eval": {"personalize": "own_update"}}  # FedRep's authors' protocol: its own update, rerun


def test_own_update_scores_the_model_the_methods_own_hook_leaves_and_keeps_nothing(tmp_path):
    fedrep = {"name": "fedrep", "head_epochs": 2}
    with_eval, without, by_hand = (runtime(tmp_path, fedrep, **OWN_UPDATE) for _ in range(3))
    g = start(with_eval)
    u1, _ = train_one(with_eval, g, CLIENT, 1)
    for rt in (without, by_hand):
        train_one(rt, g, CLIENT, 1)
    personal = with_eval.slots["personal"][CLIENT].copy()
    after = {WEIGHTS: u1[WEIGHTS]}
    [rec] = with_eval.evaluate(after, [CLIENT], round_idx=1)
    # By hand: FedRep's client hook (head epochs, then the body's) from the new global body and the client's own
    # head, with evaluation's random stream, then scored.
    hook = ClientContext(by_hand, CLIENT, 1, after, client_generator(by_hand.cfg.seed, 1, CLIENT, FINETUNE_STREAM))
    by_hand.algorithm.client_update(hook)
    loss, acc = by_hand.score(*by_hand.client_tensors(CLIENT, "test"))
    assert (rec["loss_personalized"], rec["acc_personalized"]) == (loss, acc)
    assert rec["loss_personalized"] != rec["loss"]
    # Nothing of it is kept: the client's head, and the next round, are as without evaluation.
    assert_nothing_kept(with_eval, without, after, personal)


def test_own_update_refuses_finetuning_settings_it_would_not_use_and_survives_its_stored_config(tmp_path):
    with pytest.raises(ConfigError, match="eval.finetune_lr: not used with eval.personalize: own_update"):
        config(tmp_path, "fedrep", eval={"personalize": "own_update", "finetune_lr": 0.01})
    with pytest.raises(ConfigError, match="eval.finetune_epochs: not used"):
        config(tmp_path, "fedrep", eval={"personalize": "own_update", "finetune_epochs": 0})
    cfg = config(tmp_path, "fedrep", **OWN_UPDATE)
    assert validate(cfg.model_dump()).eval.personalize == "own_update"  # config.yaml spells every field out
    assert cfg.eval.personalizes and not config(tmp_path, "fedrep", eval={"finetune_epochs": 0}).eval.personalizes


@pytest.mark.parametrize("part", ["head", "body", "full"])
def test_finetune_part_updates_only_that_part(tmp_path, part):
    rt = runtime(tmp_path, "fedavg", eval__finetune_part=part)
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


def test_uniform_weighting_ignores_sample_counts(tmp_path, monkeypatch):
    """The server's exact average of a round's uploads, each client counted once or by its training samples
    (the synthetic clients hold 54 to 632 samples, so the two averages are far apart)."""
    for weighting, other in (("uniform", "samples"), ("samples", "uniform")):
        server = started(monkeypatch, tmp_path, "fedavg", train__weighting=weighting)
        rt = runtime(tmp_path, "fedavg")
        sampled = server.round(1).sampled
        uploads = np.array([train_one(rt, start(rt), c, 1)[0][WEIGHTS] for c in sampled], np.float64)
        sizes = np.array([rt.plan.train_sizes[c] for c in sampled], np.float64)
        means = {"uniform": uploads.mean(0), "samples": (sizes[:, None] * uploads).sum(0) / sizes.sum()}
        np.testing.assert_allclose(server.state[WEIGHTS], means[weighting], rtol=0, atol=1e-6)
        assert np.abs(server.state[WEIGHTS] - means[other]).max() > 1e-3


def test_method_parameters_are_typed_and_named():
    assert validate({"algorithm": {"name": "fedprox", "mu": 0.5}}).algorithm.params == {"mu": 0.5}
    assert validate({"algorithm": "fedprox"}).algorithm.params == {"mu": 0.01}  # defaults filled in
    assert validate({"algorithm": {"name": "ditto", "lambda": 2}}).algorithm.params["lambda"] == 2
    for bad, field in (({"name": "fedprox", "mu": -1}, "algorithm.mu"), ({"name": "fedprox", "lam": 1}, "algorithm.lam"),
                       ({"name": "fedavg", "mu": 1}, "algorithm.mu")):
        with pytest.raises(ConfigError, match=field) as err:
            validate({"algorithm": bad})
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="train.mu: moved to the method's own parameters"):
        validate({"train": {"mu": 0.1}})
    assert build_algorithm(validate({"algorithm": {"name": "fedrep", "head_epochs": 2}})).params.head_epochs == 2


def test_a_users_own_loss_keeps_the_algorithms_penalty(tmp_path):
    own = {"model__client": "user_plugins:LabelSmoothingClient"}
    plain = runtime(tmp_path, {"name": "fedprox", "mu": 0.0}, **own)
    pulled = runtime(tmp_path, {"name": "fedprox", "mu": 5.0}, **own)
    assert type(plain.loop.module).__name__ == "LabelSmoothingClient"
    g = start(plain)
    (a, _), (b, _) = train_one(plain, g, CLIENT, 1), train_one(pulled, g, CLIENT, 1)
    assert plain.loop.module.smoothed_steps > 0 and pulled.loop.module.smoothed_steps > 0
    # FedProx's pull still acts on the user's loss.
    assert np.linalg.norm(b[WEIGHTS] - g[WEIGHTS]) < np.linalg.norm(a[WEIGHTS] - g[WEIGHTS])
    with pytest.raises(ConfigError, match="model.client: cannot import"):
        load_client_class("nowhere.module:Nothing")


def test_readme_algorithm_table_is_generated_from_the_code():
    from fedsim.algorithms.catalog import markdown_table

    docs = (TESTS.parent / "docs" / "algorithms.md").read_text()
    assert markdown_table() in docs, "docs/algorithms.md's table is stale: paste `fedsim algorithms --markdown`"


def test_fedsim_algorithms_lists_every_system_key_with_its_default():
    from fedsim.algorithms.catalog import text_listing
    from fedsim.config import SystemConfig

    listing = text_listing()
    assert "system.async_buffer = 10  async: reports per server step" in listing
    assert "system.devices.preset = 'uniform'" in listing and "system.availability.on_fraction = 0.5" in listing
    assert all(f"system.{key} = " in listing for key in SystemConfig.model_fields if key != "availability")


def test_fedsim_algorithms_shows_the_ranges_fedsim_tune_searches():
    from fedsim.algorithms.catalog import text_listing

    fedprox = text_listing().split("\n\nfedprox  (")[1].split("\n\n")[0]
    assert "\n    fedsim tune searches: mu choice [0.001, 0.01, 0.1, 1.0]" in fedprox


def test_every_experiment_config_validates():
    from fedsim.config import load_tree
    from fedsim.sweep.expand import expand_sweep

    for path in sorted((TESTS.parent / "experiments").glob("*.yaml")):
        assert expand_sweep(load_tree(path)), path


def test_adam_is_an_optimizer_choice_per_part(tmp_path):
    rt = runtime(tmp_path, "fedper", train__body={"optimizer": "adam", "lr": 1e-3})
    train, finetune = (rt.loop.sets[stage].optimizers for stage in ("train", "finetune"))
    assert [type(o) for o in train] == [torch.optim.Adam, torch.optim.SGD]  # body, head
    assert [type(o) for o in finetune] == [torch.optim.SGD] * 2  # FedBABU's protocol fine-tunes with SGD
    _, loss = train_one(rt, start(rt), CLIENT, 1)
    assert np.isfinite(loss)


def test_apfl_pfllib_variant_trains_v_on_its_own_loss_and_is_scored_with_the_mixture_alone(tmp_path):
    """PFLlib's APFL (clientapfl.py): alpha from 1.0, v replaced by alpha v + (1 - alpha) w at the round's end and
    scored alone (the paper's variant scores alpha v + (1 - alpha) w_global)."""
    rt = runtime(tmp_path, {"name": "apfl", "variant": "pfllib"})
    assert rt.algorithm.start_alpha == 1.0
    state = start(rt)
    uploads, _ = train_one(rt, state, CLIENT, 1)
    alpha = float(rt.slots["alpha"][CLIENT][0])
    assert 0 <= alpha <= 1 and alpha != 1.0  # alpha's own step moved it
    ctx = ClientContext(rt, CLIENT, 1, state, torch.Generator())
    rt.algorithm.load_for_evaluation(ctx)
    assert np.array_equal(ctx.pack("full"), rt.slots["personal_model"][CLIENT])  # v alone, as the round left it
    paper = runtime(tmp_path, "apfl")
    train_one(paper, state, CLIENT, 1)
    assert not np.array_equal(paper.slots["personal_model"][CLIENT], rt.slots["personal_model"][CLIENT])


def _logits(rt: ClientRuntime, full: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """The network's logits on x with the full weights ``full`` loaded, in evaluation mode."""
    rt.layouts["full"].load(full)
    rt.net.eval()
    with torch.no_grad():
        return rt.net(x)


def test_apfl_fedtorch_variant_is_scored_with_the_outputs_of_v_and_the_clients_own_w_mixed(tmp_path):
    """FedTorch's APFL (centered/apfl.py:87-134): alpha fixed by default, v trained on the mixed output's loss,
    the client scored with alpha v(x) + (1 - alpha) w(x), w as its local training left it."""
    rt = runtime(tmp_path, {"name": "apfl", "variant": "fedtorch"})
    state = start(rt)
    train_one(rt, state, CLIENT, 1)
    assert float(rt.slots["alpha"][CLIENT][0]) == 0.5  # --fed_adaptive_alpha is off by default
    v, w = rt.slots["personal_model"][CLIENT], rt.slots["local_model"][CLIENT]
    assert not np.array_equal(v, rt.initial("full")) and not np.array_equal(v, w)
    loss = rt.evaluate(state, [CLIENT], 1)[0]["loss"]
    x, y = rt.client_tensors(CLIENT, "test")
    v_logits, w_logits = _logits(rt, v, x), _logits(rt, w, x)
    mixed = float(torch.nn.functional.cross_entropy(0.5 * v_logits + 0.5 * w_logits, y))
    assert loss == pytest.approx(mixed, rel=1e-5)
    assert abs(loss - float(torch.nn.functional.cross_entropy(w_logits, y))) > 1e-3  # not w's own score
    assert rt.evaluate(state, [CLIENT], 1)[0]["loss"] == loss  # the same again: v's hook was removed after scoring


def test_apfl_fedtorch_variant_steps_alpha_once_a_round_on_its_first_batch(tmp_path):
    """With alpha adaptive, FedTorch steps it on a round's first batch only (centered/apfl.py:114): a second local
    epoch leaves the round's alpha as one epoch did, and it moved."""
    alphas = []
    for epochs in (1, 2):
        rt = runtime(tmp_path, {"name": "apfl", "variant": "fedtorch", "adaptive": True}, train__local_epochs=epochs)
        train_one(rt, start(rt), CLIENT, 1)
        alphas.append(float(rt.slots["alpha"][CLIENT][0]))
    assert alphas[0] == alphas[1] != 0.5
