"""Per-FedAvg's and pFedMe's defining properties, each against a hand computation with torch.func (an autograd path
independent of the methods' own): the MAML step and its Hessian term, the one personalisation step before scoring,
pFedMe's inner solver and the local model's move toward theta, and the server's beta mixing."""
import numpy as np
import pytest
import torch
from test_algorithms import BN_NET, CLIENT, runtime, spy_server_hook, started, train_one, whole
from torch.func import functional_call, grad, jvp

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.context import ClientContext

PLAIN = {"train__body": {"momentum": 0.0}, "train__head": {"momentum": 0.0}}  # the papers' plain steps


def _batches(rt, count: int, size: int = 10) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = rt.client_tensors(CLIENT, "train")
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(count)]


def _feed(monkeypatch, batches) -> None:
    """Every client's data for the round is exactly ``batches``, one epoch of them."""
    monkeypatch.setattr(ClientContext, "batches", lambda self, epochs: iter(list(batches)))


def _loss_fn(rt, x, y):
    def loss(params):
        return torch.nn.functional.cross_entropy(functional_call(rt.net, params, (x,)), y)
    return loss


def _global(rt) -> dict[str, torch.Tensor]:
    """The round-0 global model's parameters, as named tensors."""
    params = dict(rt.net.named_parameters())
    return {k: v for k, v in rt.layouts["full"].tensors(rt.initial("full")).items() if k in params}


def _step(params, grads, lr):
    return {k: params[k] - lr * grads[k] for k in params}


def _as_vector(rt, layout, params) -> np.ndarray:
    full = rt.layouts[layout].tensors(rt.initial(layout))
    return rt.layouts[layout].vector({**full, **{k: v.detach() for k, v in params.items() if k in full}})


def _upload(rt, state):
    uploads, loss = train_one(rt, state, CLIENT, 1)
    assert np.isfinite(loss)
    return uploads[WEIGHTS]


def _start(rt) -> dict:
    return {WEIGHTS: rt.plan.model.initial["shared"]}


# -- Per-FedAvg ------------------------------------------------------------------------------------------------------
def test_perfedavg_step_is_the_maml_step_and_hf_adds_exactly_the_hessian_term(tmp_path, monkeypatch):
    alpha, beta = 0.5, 0.2  # large, so the MAML term is far above rounding
    # The run's momentum 0.9 and weight decay stay out of both steps: the references take plain steps.
    momentum = {"train__body": {"momentum": 0.9, "weight_decay": 0.01}, "train__head": {"momentum": 0.9}}
    fo = runtime(tmp_path, {"name": "perfedavg", "variant": "fo", "alpha": alpha, "beta": beta}, **momentum)
    hf = runtime(tmp_path, {"name": "perfedavg", "variant": "hf", "alpha": alpha, "beta": beta}, **momentum)
    d1, d2, d3 = _batches(fo, 3)
    w = _global(fo)
    temp = _step(w, grad(_loss_fn(fo, *d1))(w), alpha)
    at_temp = grad(_loss_fn(fo, *d2))(temp)
    # FO, one local step from batches D, D': w - beta grad f(w - alpha grad f(w; D); D').
    _feed(monkeypatch, [d1, d2])
    got_fo = _upload(fo, _start(fo))
    np.testing.assert_allclose(got_fo, _as_vector(fo, "shared", _step(w, at_temp, beta)), rtol=1e-5, atol=1e-7)
    # It is not plain SGD on either batch: the gradient is taken after the personal step.
    plain = _as_vector(fo, "shared", _step(w, grad(_loss_fn(fo, *d2))(w), beta))
    assert np.abs(got_fo - plain).max() > 1e-4
    # HF on D, D', D'': FO's step plus beta alpha H(w; D'') grad f(temp; D'), the product by forward-over-reverse.
    _feed(monkeypatch, [d1, d2, d3])
    got_hf = _upload(hf, _start(hf))
    _, hessian_times = jvp(grad(_loss_fn(hf, *d3)), (w,), (at_temp,))
    term = _as_vector(hf, "shared", {k: beta * alpha * v for k, v in hessian_times.items()})  # the MLP: parameters only
    assert np.abs(term).max() > 1e-5
    np.testing.assert_allclose(got_hf - got_fo, term, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("params, beta_is_lr", [({}, True), ({"beta": 0.001}, False)])
def test_perfedavg_defaults_are_pfllibs_and_a_fixed_beta_the_pfedme_authors(tmp_path, monkeypatch, params, beta_is_lr):
    """Defaults (PFLlib clientperavg.py:14): FO, alpha = beta = the run's lr; beta 0.001: the pFedMe authors'
    (README.md:44). Two steps with the run's momentum 0.9 in the config: still plain steps."""
    rt = runtime(tmp_path, {"name": "perfedavg", **params}, train__body={"momentum": 0.9}, train__head={"momentum": 0.9})
    assert rt.algorithm.params.variant == "fo"
    lr = rt.settings.lr("body", 1)
    beta = lr if beta_is_lr else 0.001
    batches = _batches(rt, 4)
    w = dict(_global(rt))
    for d1, d2 in (batches[:2], batches[2:]):
        w = _step(w, grad(_loss_fn(rt, *d2))(_step(w, grad(_loss_fn(rt, *d1))(w), lr)), beta)
    _feed(monkeypatch, batches)
    np.testing.assert_allclose(_upload(rt, _start(rt)), _as_vector(rt, "shared", w), rtol=1e-5, atol=1e-7)


def test_perfedavg_steps_take_two_or_three_batches(tmp_path, monkeypatch):
    """Five batches: FO steps on (1, 2), (3, 4), (5, 1); HF on (1, 2, 3), (4, 5, 1): the short group completed from
    the epoch's start."""
    for variant, steps in (("fo", 3), ("hf", 2)):
        rt = runtime(tmp_path, {"name": "perfedavg", "variant": variant})
        _feed(monkeypatch, _batches(rt, 5))
        assert len(rt.algorithm.client_update(ClientContext(rt, CLIENT, 1, _start(rt), torch.Generator()))) == steps


def test_perfedavg_scores_the_global_model_after_exactly_one_alpha_step(tmp_path, monkeypatch):
    alpha = 0.3
    rt = runtime(tmp_path, {"name": "perfedavg", "alpha": alpha})
    d1, d2 = _batches(rt, 2)
    _feed(monkeypatch, [d1, d2])
    rt.algorithm.load_for_evaluation(ClientContext(rt, CLIENT, 1, _start(rt), torch.Generator()))
    w = _global(rt)
    expected = _step(w, grad(_loss_fn(rt, *d1))(w), alpha)
    for k, p in rt.net.named_parameters():
        torch.testing.assert_close(p.detach(), expected[k], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(rt.net.classifier.weight, w["classifier.weight"], atol=1e-6)


# -- pFedMe ----------------------------------------------------------------------------------------------------------
def test_pfedme_solves_for_theta_and_moves_the_local_model_toward_it(tmp_path, monkeypatch):
    lam, plr, k, mu = 15.0, 0.01, 3, 0.001
    # The run's momentum 0.9 stays out of the solver: the authors' pFedMeOptimizer takes plain steps.
    rt = runtime(tmp_path, {"name": "pfedme", "lambda": lam, "personal_lr": plr, "K": k}, train__body={"momentum": 0.9},
                 train__head={"momentum": 0.9})
    batch, eta = _batches(rt, 1)[0], rt.settings.lr("body", 1)
    _feed(monkeypatch, [batch])
    w = _global(rt)
    upload = _upload(rt, _start(rt))
    # By hand: K plain steps on f(theta) + lambda/2 ||theta - w||^2 + mu/2 ||theta||^2 from theta = w, then
    # w - eta lambda (w - theta).
    theta = dict(w)
    for _ in range(k):
        g = grad(_loss_fn(rt, *batch))(theta)
        theta = {n: theta[n] - plr * (g[n] + lam * (theta[n] - w[n]) + mu * theta[n]) for n in theta}
    personal = rt.slots["personal_model"][CLIENT]
    np.testing.assert_allclose(personal, _as_vector(rt, "full", theta), rtol=1e-5, atol=1e-7)
    moved = {n: w[n] - eta * lam * (w[n] - theta[n]) for n in w}
    np.testing.assert_allclose(upload, _as_vector(rt, "shared", moved), rtol=1e-5, atol=1e-7)
    # The defining move, read off the engine's own results: w' - w = eta lambda (theta - w), theta != w'.
    start = rt.plan.model.initial["shared"].astype(np.float64)
    np.testing.assert_allclose(upload - start, eta * lam * (personal - start), rtol=1e-4, atol=1e-7)
    assert np.abs(personal - upload).max() > 1e-3


def test_pfedme_scores_theta_and_a_client_without_one_the_global_model(tmp_path):
    rt = runtime(tmp_path, "pfedme", **BN_NET)
    state = _start(rt)
    train_one(rt, state, CLIENT, 1)
    rt.algorithm.load_for_evaluation(ClientContext(rt, CLIENT, 1, state, torch.Generator()))
    personal = rt.slots["personal_model"][CLIENT]
    assert np.array_equal(rt.layouts["full"].pack(), personal)
    stats = [slice(s, e) for key, _, s, e in rt.layouts["full"].spans() if key.endswith("running_mean")]
    assert stats and not np.array_equal(personal[stats[0]], rt.initial("full")[stats[0]])  # theta's own statistics
    rt.algorithm.load_for_evaluation(ClientContext(rt, CLIENT + 1, 1, state, torch.Generator()))
    assert np.array_equal(rt.layouts["full"].pack(), rt.initial("full"))


@pytest.mark.parametrize("beta", [1.0, 0.4])
def test_pfedme_server_mixes_the_average_with_the_old_global_model(tmp_path, monkeypatch, beta):
    server = started(monkeypatch, tmp_path, {"name": "pfedme", "beta": beta})
    calls = spy_server_hook(server)
    server.round(1)
    seen = whole(calls)
    mean, before = seen["means"][WEIGHTS], seen["before"][WEIGHTS]
    if beta == 1:  # the plain mean, bit for bit
        assert server.state[WEIGHTS].tobytes() == mean.astype(np.float32).tobytes()
    else:
        np.testing.assert_array_equal(server.state[WEIGHTS], ((1 - beta) * before + beta * mean).astype(np.float32))
        assert np.abs(server.state[WEIGHTS] - mean.astype(np.float32)).max() > 1e-4


def test_pfedme_defaults_are_one_of_the_authors_settings_and_a_round_is_local_steps_batches(tmp_path, monkeypatch):
    """CharlieDinh/pFedMe main.py:71-78 (README.md:71): lambda 15, personal lr 0.09, K 5, --local_epochs 20 meaning
    20 batches (one per "local epoch", drawn on through the passes as the data runs out)."""
    rt = runtime(tmp_path, "pfedme", train__batch_size=50)
    p = rt.algorithm.params
    assert (p.lam, p.personal_lr, p.K, p.local_steps, p.mu) == (15.0, 0.09, 5, 20, 0.001)
    per_pass = -(-rt.plan.train_sizes[CLIENT] // rt.plan.cfg.train.batch_size)
    assert per_pass < 20  # so the round runs on into a second pass
    losses = rt.algorithm.client_update(ClientContext(rt, CLIENT, 1, _start(rt), torch.Generator()))
    assert len(losses) == 20 * 5
    whole_passes = runtime(tmp_path, {"name": "pfedme", "local_steps": None}, train__local_epochs=2,
                           train__batch_size=50)
    losses = whole_passes.algorithm.client_update(ClientContext(whole_passes, CLIENT, 1, _start(rt), torch.Generator()))
    assert len(losses) == 2 * per_pass * 5


def test_pfedme_clamps_ws_step_to_the_authors_range_and_says_so(tmp_path, monkeypatch):
    """eta x lambda above step_limit (0.15, the authors' largest): w closes 0.15 of its gap to theta, and the dry
    run's notice names the product and the limit; at the authors' lr it says nothing."""
    rt = runtime(tmp_path, "pfedme", train__body={"lr": 0.1}, train__head={"lr": 0.1})
    batch = _batches(rt, 1)[0]
    _feed(monkeypatch, [batch])
    start = rt.plan.model.initial["shared"].astype(np.float64)
    upload = _upload(rt, _start(rt))
    personal = rt.slots["personal_model"][CLIENT]
    np.testing.assert_allclose(upload - start, 0.15 * (personal - start), rtol=1e-4, atol=1e-7)
    notice = rt.algorithm.settings_notice(rt.cfg.train)
    assert notice is not None and "= 1.5" in notice and "step_limit 0.15" in notice
    authors = runtime(tmp_path, "pfedme", train__body={"lr": 0.005}, train__head={"lr": 0.005})
    assert authors.algorithm.settings_notice(authors.cfg.train) is None
