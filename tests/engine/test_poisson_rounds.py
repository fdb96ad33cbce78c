"""The server under train.sampling: poisson: a round that draws no one trains no one, leaves the server's state as
it was, and still counts for the accountant (its epsilon is recorded like any other round's)."""
import numpy as np
from conftest import in_process_server, synthetic_tree

from fedsim.config import validate
from fedsim.privacy import EPSILON


def test_an_empty_poisson_round_keeps_the_state_and_still_spends(tmp_path, monkeypatch):
    tree = {**synthetic_tree(tmp_path, algorithm="fedavg", **{"train.sampling": "poisson", "train.fraction": 0.15,
                                                              "train.rounds": 6, "train.eval_every": 6, "seed": 4}),
            "privacy": {"noise_multiplier": 1.0}}
    server = in_process_server(monkeypatch, validate(tree))
    server.restore(None)
    plan, results, weights = server.plan, [], []
    for round_idx in range(1, 7):
        before = server.global_weights().copy()
        results.append(server.round(round_idx))
        weights.append((before, server.global_weights()))
    empty = [i for i, r in enumerate(results) if not r.sampled]
    assert empty and any(r.sampled for r in results)  # seed 4 draws nobody in round 4, somebody in the others
    for i in empty:
        before, after = weights[i]
        assert np.array_equal(before, after) and results[i].comm == []
    spent = [r.privacy[EPSILON] for r in results]
    assert spent == [plan.privacy_at(r)[EPSILON] for r in range(1, 7)] and spent == sorted(set(spent))


def test_poisson_rounds_are_the_same_on_one_and_two_workers(tmp_path, monkeypatch):
    from conftest import round_records

    outcomes = []
    for workers in (1, 2):
        tree = synthetic_tree(tmp_path, algorithm="fedavg", **{"train.sampling": "poisson", "train.fraction": 0.3,
                                                                "train.rounds": 3, "train.eval_every": 3,
                                                                "engine.workers": workers})
        server = in_process_server(monkeypatch, validate(tree))
        server.restore(None)
        outcomes.append([server.round(r) for r in range(1, 4)])
    assert round_records(outcomes[0]) == round_records(outcomes[1])
    assert len({len(o.sampled) for o in outcomes[0]}) > 1  # the rounds' sizes vary: Poisson, not a fixed cohort
