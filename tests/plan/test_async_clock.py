"""FedBuff's schedule on the virtual clock: a step every ``buffer`` reports, each report with its model version,
never more than ``concurrency`` clients in flight, and the whole schedule a function of the seed."""
import numpy as np

from fedsim.config import SystemConfig
from fedsim.plan import Population
from fedsim.plan.async_clock import AsyncClock
from fedsim.plan.system import build_system

N, FRACTION, SEED = 40, 0.25, 7


def async_clock(concurrency: int = 8, buffer: int = 4, seed: int = SEED, **system) -> AsyncClock:
    cfg = SystemConfig.model_validate({"devices": {"preset": "lognormal", "sigma": 1.0}, "mode": "async", **system})
    return AsyncClock(build_system(cfg, seed, N), seed, Population(N, fraction=FRACTION), np.full(N, 200.0), 1_000_000,
                      500_000, concurrency=concurrency, buffer=buffer)


def test_fedbuffs_schedule_steps_every_k_reports_with_each_clients_model_version():
    c = async_clock(dropout=0.1, availability={"pattern": "diurnal", "period_s": 50.0, "on_fraction": 0.5})
    previous_end, stale = 0.0, []
    for r in range(1, 80):
        t = c.round(r)
        assert len(t.participants) == 4 == len(set(t.participants))  # a client reports at most once per step
        assert all(0 <= v <= r - 1 for v in t.versions) and t.start_s == previous_end and t.seconds >= 0
        assert all(v < r for v in t.live_versions)
        previous_end = t.end_s
        stale += t.staleness()
    assert max(stale) >= 2 and 0 in stale  # fast devices report fresh, slow ones several steps late
    assert [c.round(r) for r in range(1, 80)] == [async_clock(dropout=0.1, availability={
        "pattern": "diurnal", "period_s": 50.0, "on_fraction": 0.5}).round(r) for r in range(1, 80)]
    assert [c.round(r).participants for r in range(1, 20)] != [
        async_clock(seed=SEED + 1).round(r).participants for r in range(1, 20)]


def test_fedbuffs_clients_in_flight_never_exceed_the_concurrency():
    c = async_clock(concurrency=5, buffer=3)
    for r in range(1, 60):
        c.round(r)
        assert len(c._flight) <= 5
    stepped = sum(len(t.participants) for t in c.rounds)
    selected = sum(len(t.selected) for t in c.rounds) + len(c._window["selected"])  # and those since the last step
    assert selected - stepped == len(c._flight) + len(c._buffered)  # every dispatch reported in a step, or is pending
