"""server.aggregator: robust rules in place of the mean, for the FedAvg family. Each rule against a hand computation,
through the engine's own server (in-process workers), and the same bit for bit on 1, 2 and 3 workers."""
import numpy as np
import pytest
from conftest import in_process_server, round_records, six_client_run

from fedsim.algorithms import WEIGHTS
from fedsim.core.robust import coordinate_median, krum_scores, krum_selection, trimmed_mean

RULES = {"median": {}, "trimmed_mean": {"trim_fraction": 0.34}, "krum": {"byzantine": 0}}


def test_rules_by_hand():
    rng = np.random.default_rng(0)
    replies = [rng.normal(size=7).astype(np.float32) for _ in range(5)]
    stacked = np.stack(replies).astype(np.float64)
    assert np.array_equal(coordinate_median(replies), np.sort(stacked, axis=0)[2])
    # beta = 0.2 of 5 drops one value at each end of every coordinate
    assert np.allclose(trimmed_mean(replies, 0.2), np.sort(stacked, axis=0)[1:4].mean(axis=0), rtol=0, atol=1e-15)
    assert np.array_equal(trimmed_mean(replies, 0.0), stacked.mean(axis=0))


def test_krum_keeps_the_honest_cluster_and_scores_by_nearest_neighbours():
    honest = [np.full(4, v, np.float32) for v in (1.0, 1.1, 0.9, 1.05)]
    attacker = np.full(4, 50.0, np.float32)
    replies = honest[:2] + [attacker] + honest[2:]
    scores = krum_scores(replies, byzantine=1)  # n - f - 2 = 2 nearest others
    d = lambda a, b: float(np.sum((a.astype(np.float64) - b) ** 2))  # noqa: E731
    expected = [sum(sorted(d(r, o) for j, o in enumerate(replies) if j != i)[:2]) for i, r in enumerate(replies)]
    assert np.allclose(scores, expected, rtol=1e-12)
    assert 2 not in krum_selection(replies, byzantine=1, select=3)
    assert krum_selection(replies, byzantine=1, select=1) == [int(np.argmin(expected))]


def _server(monkeypatch, tmp_path, data_root, rule, workers=2):
    cfg = six_client_run(tmp_path, data_root, "fedavg", workers)
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"aggregator": rule, **RULES[rule]})})
    server = in_process_server(cfg)
    server.restore(None)
    return server


def _replies_seen(server) -> list:
    """The replies the server folds each round, as it gets them: (client, its weights upload, if any)."""
    seen, fold = [], server.reduction.fold

    def spy(replies):
        seen.append([(r.client, r.uploads[WEIGHTS].copy() if WEIGHTS in r.uploads else None) for r in replies])
        fold(replies)

    server.reduction.fold = spy
    return seen


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_server_applies_the_rule_to_the_replies_in_client_order(tmp_path, data_root, monkeypatch, rule):
    server = _server(monkeypatch, tmp_path, data_root, rule)
    seen = _replies_seen(server)
    result = server.round(1)
    clients, vectors = zip(*seen[0])
    assert list(clients) == result.sampled == sorted(clients)
    expected = {"median": lambda: coordinate_median(vectors),
                "trimmed_mean": lambda: trimmed_mean(vectors, 0.34),
                "krum": lambda: vectors[krum_selection(vectors, 0, 1)[0]]}[rule]()
    assert np.array_equal(server.state[WEIGHTS], np.asarray(expected, np.float32))
    assert not np.array_equal(server.state[WEIGHTS], np.mean(np.stack(vectors), axis=0).astype(np.float32))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_robust_rounds_are_bit_identical_on_one_two_and_three_workers(tmp_path, data_root, monkeypatch, rule):
    results = []
    for workers in (1, 2, 3):
        server = _server(monkeypatch, tmp_path, data_root, rule, workers)
        results.append((round_records([server.round(r) for r in (1, 2)]), server.state[WEIGHTS].copy()))
    assert results[0][0] == results[1][0] == results[2][0]
    assert all(np.array_equal(results[0][1], r[1]) for r in results[1:])


@pytest.mark.parametrize("algorithm, rule", [("fedavg", "median"), ("fedamp", "mean"), ("ifca", "mean"),
                                             ("fedfomo", "mean")])
def test_replies_give_the_same_round_in_any_completion_order(tmp_path, data_root, monkeypatch, algorithm, rule):
    """The server folds replies in client order, so workers answering in another order change nothing."""
    def run(reverse: bool):
        cfg = six_client_run(tmp_path, data_root, algorithm, 3)
        cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"aggregator": rule, **RULES.get(rule, {})})})
        server = in_process_server(cfg)
        server.restore(None)
        folded = _replies_seen(server)
        if reverse:
            ordered = server.pool.as_completed
            monkeypatch.setattr(server.pool, "as_completed", lambda refs: reversed(list(ordered(refs))))
        outcome = round_records([server.round(r) for r in (1, 2)]), {k: v.copy() for k, v in server.state.items()}
        assert all([c for c, _ in replies] == sorted(c for c, _ in replies) for replies in folded)
        return outcome

    (records, state), (reversed_records, reversed_state) = run(False), run(True)
    assert records == reversed_records
    assert state.keys() == reversed_state.keys() and all(np.array_equal(state[k], reversed_state[k]) for k in state)
