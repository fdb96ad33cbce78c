"""Results do not depend on how many workers run them: every method, 1, 2 and 3 workers, bit for bit,
through the engine's own Server (in-process workers; tests/test_engine.py does the same over Ray)."""
import numpy as np
import pytest
from conftest import in_process_server, small_config

from fedsim.algorithms import ALGORITHMS
from fedsim.data import load_dataset, make_partition

ROUNDS = 2
QUICK = {"fedrep": {"head_epochs": 2}}  # the default 10 head epochs test nothing more, slowly


def _setup(tmp_path, data_root, algorithm, workers):
    cfg = small_config(tmp_path, data_root, algorithm={"name": algorithm, **QUICK.get(algorithm, {})}, seed=4,
                       data__num_clients=6, data__k=3, data__train_fraction=0.006, data__test_fraction=0.02,
                       train__rounds=ROUNDS, train__eval_every=ROUNDS, train__fraction=0.5, train__batch_size=20,
                       eval__finetune_epochs=1, engine__workers=workers, engine__cpus_per_worker=0.5)
    data = load_dataset("cifar10", data_root)
    partition = make_partition("classes", data.train_y, data.test_y, 6, 4, k=3, train_fraction=0.006,
                               test_fraction=0.02)
    return cfg, partition, data


def _records(outcomes) -> list:
    return [(o.round, o.sampled, o.records, o.comm) for o in outcomes]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_method_is_bit_identical_on_one_two_and_three_workers(tmp_path, data_root, monkeypatch, algorithm):
    results = {}
    for workers in (1, 2, 3):
        server = in_process_server(monkeypatch, *_setup(tmp_path, data_root, algorithm, workers))
        server.restore(None)
        results[workers] = (_records([server.round(r) for r in range(1, ROUNDS + 1)]), server.state)
    (one, state1), (two, state2), (three, state3) = results.values()
    assert one == two == three
    assert all(np.array_equal(state1[k], s[k]) for s in (state2, state3) for k in state1)


@pytest.mark.parametrize("algorithm", ["scaffold", "fedavgm", "apfl", "fedper"])
def test_checkpointed_server_and_client_state_resume_exactly(tmp_path, data_root, monkeypatch, algorithm):
    """Server slots (momentum, control variates) and client slots survive a checkpoint, also when the
    resumed run has another number of workers."""
    straight = in_process_server(monkeypatch, *_setup(tmp_path, data_root, algorithm, 2))
    straight.restore(None)
    expected = _records([straight.round(r) for r in range(1, ROUNDS + 1)])

    first = in_process_server(monkeypatch, *_setup(tmp_path, data_root, algorithm, 2))
    first.restore(None)
    head = _records([first.round(1)])
    ckpt = first.checkpoint(str(tmp_path / "run"), 1)
    resumed = in_process_server(monkeypatch, *_setup(tmp_path, data_root, algorithm, 3))
    assert resumed.restore(ckpt) == 1
    assert head + _records([resumed.round(2)]) == expected


def test_a_client_outside_the_fixed_point_range_keeps_nothing_and_is_reported(tmp_path, data_root):
    from conftest import client_runtime

    from fedsim.algorithms import WEIGHTS
    from fedsim.engine.aggregate import FixedPoint
    from fedsim.engine.protocol import SumPlan

    rt = client_runtime(data_root, "fedper")
    weights = rt.layouts["shared"].pack(rt.net)
    fits = SumPlan({WEIGHTS: FixedPoint.plan(weights, rt.layouts["shared"].offsets, 1000)}, {WEIGHTS: False})
    tiny = SumPlan({WEIGHTS: FixedPoint.plan(weights * 1e-9, rt.layouts["shared"].offsets, 1000)}, {WEIGHTS: False})
    out = rt.train_and_sum({WEIGHTS: weights}, [0, 1], 1, tiny)
    assert [r.diverged for r in out.reports] == [True, True] and not out.sums[WEIGHTS].any()
    assert out.weights[WEIGHTS] == 0 and len(rt.slots["personal"]) == 0  # no personal state kept either
    kept = rt.train_and_sum({WEIGHTS: weights}, [0, 1], 1, fits)
    assert not any(r.diverged for r in kept.reports) and len(rt.slots["personal"]) == 2
    assert kept.weights[WEIGHTS] == sum(r.n_train for r in kept.reports)
