"""The two-stage search (``fedsim.sweep.search``): the shared stage is the same for every method and does not depend on
any method's own space; each method's own draws come from a stream of their own, independent of the shared draws and of
every other method's; the authors' defaults are always in stage 1 and never repeated in stage 2."""
import pytest

from fedsim.algorithms import ALGORITHMS, algorithm_class
from fedsim.config import Distribution, TuneConfig
from fedsim.sweep import search


def _tune(**over) -> TuneConfig:
    return TuneConfig.model_validate({"methods": ["fedavg", "fedprox", "ifca"], "seeds": [0, 1], **over})


def test_the_grid_crosses_every_effective_step_with_every_momentum():
    trials = search.shared_trials(_tune(grid={"step": [0.05, 0.1], "momentum": [0.0, 0.9]}, space={}), seed=0)
    assert [(t["lr"], t["momentum"]) for t in trials] == [(0.05, 0.0), (0.005, 0.9), (0.1, 0.0), (0.01, 0.9)]
    assert all(t["lr"] / (1 - t["momentum"]) in (pytest.approx(0.05), pytest.approx(0.1)) for t in trials)


def test_the_grid_refuses_lr_in_the_space_beside_it():
    with pytest.raises(ValueError, match="space.lr: the grid sets lr and momentum"):
        _tune(grid={"step": [0.1]}, space={"lr": {"loguniform": [0.01, 0.1]}})
    with pytest.raises(ValueError, match="distinct momenta in"):
        _tune(grid={"step": [0.1], "momentum": [0.9, 1.0]}, space={})


def test_own_draws_are_independent_of_the_shared_draws_and_of_other_methods(monkeypatch):
    space = search.own_space("fedprox", {})
    at_one = search.own_trials(0, "fedprox", space, {"lr": 0.01, "momentum": 0.9}, 2)
    at_other = search.own_trials(0, "fedprox", space, {"lr": 0.3, "momentum": 0.0}, 2)
    assert [t["algorithm.mu"] for t in at_one] == [t["algorithm.mu"] for t in at_other]  # not tied to an lr
    shared = search.shared_trials(_tune(), seed=0)
    # Another method's space grows: neither the shared draws nor FedProx's own draws move.
    monkeypatch.setattr(algorithm_class("ifca"), "tunable", {**algorithm_class("ifca").tunable,
                                                              "extra": Distribution(uniform=[0, 1])})
    assert search.shared_trials(_tune(), seed=0) == shared
    assert search.own_trials(0, "fedprox", space, {"lr": 0.01, "momentum": 0.9}, 2) == at_one
    assert search.own_trials(1, "fedprox", space, {"lr": 0.01}, 2) != search.own_trials(0, "fedprox", space, {"lr": 0.01}, 2)


@pytest.mark.parametrize("method", sorted(name for name, cls in ALGORITHMS.items() if cls.tunable))
def test_stage_two_is_distinct_and_never_the_authors_defaults(method):
    space = search.own_space(method, {})
    defaults = algorithm_class(method).Params().model_dump(by_alias=True)
    trials = search.own_trials(3, method, space, {"lr": 0.02, "momentum": 0.0}, 2)
    own = [{k: t[k] for k in space} for t in trials if set(space) <= set(t)]
    assert len(trials) == 2 and len({repr(sorted(o.items())) for o in own}) == len(own)
    assert all(o != {k: defaults[k.removeprefix("algorithm.")] for k in space} for o in own)


def test_a_method_ignoring_momentum_runs_each_distinct_point_once(monkeypatch):
    shared = search.shared_trials(_tune(grid={"step": [0.05, 0.1], "momentum": [0.0, 0.9]}, space={}), seed=0)
    monkeypatch.setattr(algorithm_class("fedavg"), "unused_settings", frozenset({"momentum"}))
    ran = search.for_method("fedavg", shared)
    assert ran == [{"lr": 0.05, "momentum": 0.0}, {"lr": 0.005, "momentum": 0.0}, {"lr": 0.1, "momentum": 0.0},
                   {"lr": 0.01, "momentum": 0.0}]
    same = [{"lr": 0.05, "momentum": 0.0}, {"lr": 0.05, "momentum": 0.9}]
    assert search.for_method("fedavg", same) == [{"lr": 0.05, "momentum": 0.0}]  # no copy of one run as a chance


def test_a_method_without_own_parameters_refines_the_step_instead():
    assert search.own_trials(0, "fedavg", {}, {"lr": 0.1, "momentum": 0.9}, 3) == [
        {"lr": pytest.approx(0.0707107), "momentum": 0.9}, {"lr": pytest.approx(0.141421), "momentum": 0.9},
        {"lr": pytest.approx(0.05), "momentum": 0.9}]
    assert search.own_trials(0, "fedavg", {}, {"local_epochs": 2}, 2) == []  # no lr to refine: nothing to add
    assert [search.trial_label(k, 3) for k in (0, 2, 3, 4)] == ["t0", "t2", "o0", "o1"]
