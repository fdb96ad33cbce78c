"""FedBuff's server step (fedsim/engine/fedbuff.py): the staleness-weighted update of the weights, BatchNorm's
statistics averaged instead of stepped, and the older models kept while clients still train from them."""
import numpy as np

from fedsim.core.protocol import WEIGHTS, ClientReport, FixedPointScales
from fedsim.engine.fedbuff import FedBuff
from fedsim.plan.system import RoundTime


def test_fedbuffs_server_step_is_the_staleness_weighted_mean_update():
    """x_r = x_(r-1) + server_lr x sum_j n_j s_j (x_j - x_(v_j)) / sum_j n_j, s_j = (1 + staleness)^-0.5."""
    rng = np.random.default_rng(0)
    size = 50
    statistics = np.zeros(size, bool)
    statistics[40:] = True  # the last tensor: BatchNorm's running statistics
    fedbuff = FedBuff(0.7, statistics)
    x0, x1, xa, xb = (rng.standard_normal(size).astype(np.float32) for _ in range(4))
    fedbuff.models = {0: x0}
    timing = RoundTime(2, 0.0, 1.0, (3, 5), (3, 5), (), (), versions=(0, 1))  # client 3 from x0, 5 from x1
    factors = {3: 2 ** -0.5, 5: 1.0}
    kept = [ClientReport(3, 30, 0.1, 0), ClientReport(5, 10, 0.1, 0)]
    scaling = FixedPointScales({}, {WEIGHTS: False}, factors)
    mean = (30 * factors[3] * xa.astype(np.float64) + 10 * xb) / 40
    expected = x1 + 0.7 * (30 * factors[3] * (xa.astype(np.float64) - x0) + 10 * (xb.astype(np.float64) - x1)) / 40
    # BatchNorm's running statistics take the reports' staleness-weighted mean instead: a convex combination, so a
    # variance stays positive (a step of stale differences can make it negative).
    expected[statistics] = ((30 * factors[3] * xa.astype(np.float64) + 10 * xb) / (30 * factors[3] + 10))[statistics]
    step = fedbuff.step(scaling, kept, timing, x1)
    assert np.allclose(step.apply(x1, mean, 0, size), expected, rtol=0, atol=1e-6)  # all one tensor
    by_tensor = np.concatenate([step.apply(x1, mean[a:b], a, b) for a, b in ((0, 40), (40, 50))])
    assert np.array_equal(by_tensor, step.apply(x1, mean, 0, size))  # element by element: any tensor split


def test_older_models_are_kept_while_held_and_travel_in_the_checkpoint():
    fedbuff = FedBuff(1.0, np.zeros(3, bool))
    first, second = np.ones(3, np.float32), np.full(3, 2, np.float32)
    fedbuff.keep(first, RoundTime(1, 0.0, 1.0, (), (), (), (), versions=(), live_versions=(0,)))
    fedbuff.keep(second, RoundTime(2, 0.0, 1.0, (), (), (), (), versions=(), live_versions=(1,)))
    assert list(fedbuff.models) == [1] and fedbuff.models[1] is second  # nobody trains from step 0's model now
    saved = {"m": np.zeros(3, np.float32), **fedbuff.checkpointed()}
    restored = FedBuff(1.0, np.zeros(3, bool))
    assert list(restored.restore(saved)) == ["m"]
    assert list(restored.models) == [1] and np.array_equal(restored.models[1], second)


def test_server_momentum_steps_the_velocity_of_the_mean_update_and_travels_in_the_checkpoint():
    """v_r = m v_(r-1) + mean update, x_r = x_(r-1) + server_lr v_r (FLSim's server SGD with momentum); statistics
    take the mean, as without momentum; the buffer is checkpointed."""
    rng = np.random.default_rng(1)
    size, lr, m = 20, 0.7, 0.9
    statistics = np.zeros(size, bool)
    statistics[15:] = True
    fedbuff = FedBuff(lr, statistics, momentum=m)
    x = rng.standard_normal(size).astype(np.float32)
    kept = [ClientReport(0, 10, 0.1, 0)]
    velocity = np.zeros(size)
    for step_index in (1, 2):
        timing = RoundTime(step_index, 0.0, 1.0, (0,), (0,), (), (), versions=(step_index - 1,))
        mean = rng.standard_normal(size)
        step = fedbuff.step(FixedPointScales({}, {WEIGHTS: True}, {0: 1.0}), kept, timing, x)
        velocity = m * velocity + (mean - x)
        velocity[statistics] = 0
        expected = x + lr * velocity
        expected[statistics] = mean[statistics]
        got = np.concatenate([step.apply(x, mean[a:b], a, b) for a, b in ((0, 15), (15, 20))])
        assert np.allclose(got, expected, rtol=0, atol=1e-6)
        x = got.astype(np.float32)
    restored = FedBuff(lr, statistics, momentum=m)
    assert list(restored.restore({"m": np.zeros(3), **fedbuff.checkpointed()})) == ["m"]
    assert restored.velocity is not None and np.array_equal(restored.velocity, fedbuff.velocity)
    assert FedBuff(lr, statistics).checkpointed() == {}  # no momentum: no buffer, the checkpoint as before
