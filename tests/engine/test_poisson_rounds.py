"""The server under train.sampling: poisson: a round that draws no one trains no one and still counts for the
accountant (its epsilon is recorded like any other round's); under central DP it still releases the noise (the
accountant's mechanism does every round), under local DP the server's state stays as it was."""
import numpy as np
import pytest
from conftest import in_process_server, synthetic_tree

from fedsim.config import validate
from fedsim.privacy import EPSILON


@pytest.mark.parametrize("dp", ["central", "local"])
def test_an_empty_poisson_round_still_spends_and_releases_noise_under_central_dp(tmp_path, monkeypatch, dp):
    tree = {**synthetic_tree(tmp_path, algorithm="fedavg", **{"train.sampling": "poisson", "train.fraction": 0.15,
                                                              "train.rounds": 6, "train.eval_every": 6, "seed": 4,
                                                              "train.weighting": "uniform"}),
            "privacy": {"dp": dp, "noise_multiplier": 1.0}}
    server = in_process_server(validate(tree))
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
        assert np.array_equal(before, after) != (dp == "central") and results[i].comm == []
    spent = [r.spent[EPSILON] for r in results]
    assert spent == [plan.privacy_at(r)[EPSILON] for r in range(1, 7)] and spent == sorted(spent)
    if dp == "central":  # every round, empty or not, spends
        assert len(set(spent)) == len(spent)


def test_poisson_rounds_are_the_same_on_one_and_two_workers(tmp_path, monkeypatch):
    from conftest import round_records

    outcomes = []
    for workers in (1, 2):
        tree = synthetic_tree(tmp_path, algorithm="fedavg", **{"train.sampling": "poisson", "train.fraction": 0.3,
                                                                "train.rounds": 3, "train.eval_every": 3,
                                                                "engine.workers": workers})
        server = in_process_server(validate(tree))
        server.restore(None)
        outcomes.append([server.round(r) for r in range(1, 4)])
    assert round_records(outcomes[0]) == round_records(outcomes[1])
    assert len({len(o.sampled) for o in outcomes[0]}) > 1  # the rounds' sizes vary: Poisson, not a fixed cohort
