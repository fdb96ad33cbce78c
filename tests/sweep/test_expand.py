"""fedsim/sweep/expand.py: a config's sweep as its runs: the grid crossed with the draws, deterministic from the
seed, each run validated and named by its values."""
import numpy as np
import pytest

from fedsim.config import Distribution, validate
from fedsim.errors import ConfigError
from fedsim.sweep.expand import draw, expand_sweep

BASE = {"name": "s", "algorithm": "fedavg", "data": {"num_clients": 4}}


def test_the_grid_gives_one_named_run_per_combination():
    runs = expand_sweep({**BASE, "sweep": {"algorithm": ["fedavg", {"name": "fedprox", "mu": 0.1}], "seed": [0, 1]}})
    assert [r.name for r in runs] == ["s-fedavg-0", "s-fedavg-1", "s-fedprox-0", "s-fedprox-1"]
    assert [r.seed for r in runs] == [0, 1, 0, 1] and runs[2].algorithm.params == {"mu": 0.1}
    # A variant's seeds share one W&B group, so W&B averages seeds and never methods.
    assert [r.logging.wandb.group for r in runs] == ["s-fedavg", "s-fedavg", "s-fedprox", "s-fedprox"]
    assert all(not r.sweep for r in runs)
    assert expand_sweep(BASE) == [validate(BASE)]


def test_draws_are_deterministic_from_the_seed_and_shared_by_the_grid():
    tree = {**BASE, "sweep": {"train.body.lr": {"loguniform": [1e-3, 1e-1]}, "seed": [0, 1]},
            "search": {"samples": 3}}
    first, again = expand_sweep(tree), expand_sweep(tree)
    assert [r.name for r in first] == [r.name for r in again] and len(first) == 6
    rates = [r.train.body.lr for r in first]
    assert rates[0::2] == rates[1::2]  # each draw shared by the grid's seeds: a paired comparison
    assert len(set(rates)) == 3 and all(1e-3 <= lr <= 1e-1 for lr in rates)
    other = expand_sweep({**tree, "seed": 5})
    assert [r.train.body.lr for r in other] != rates


def test_a_draw_keeps_six_digits_and_stays_in_its_range():
    rng = np.random.default_rng(0)
    values = [draw(Distribution(uniform=(0.0, 1.0)), rng) for _ in range(50)]
    assert all(0 <= v <= 1 and v == float(f"{v:.6g}") for v in values)
    assert {draw(Distribution(randint=(2, 4)), rng) for _ in range(50)} == {2, 3}
    assert {draw(Distribution(choice=["a", "b"]), rng) for _ in range(50)} == {"a", "b"}


@pytest.mark.parametrize("sweep, search, message", [
    ({"seed": []}, {}, "sweep.seed: an empty list gives no runs"),
    ({"seed": [0, 1]}, {"samples": 2}, "search.samples: 2 samples of a sweep without distributions would repeat"),
    ({"seed": {"choice": [1]}}, {"samples": 2}, r"search.samples: two draws gave the same values \(s-1\)"),
    ({"train.rounds": [0]}, {}, r"sweep: train.rounds: Input should be greater than or equal to 1 \(got 0\) "
                                r"\(in the run s-0\)"),
])
def test_a_sweep_that_gives_no_sound_runs_is_refused(sweep, search, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        expand_sweep({**BASE, "sweep": sweep, "search": search})
