"""The virtual clock: devices, availability, dropouts, over-selection and deadlines as pure functions of the seed
and the config (tests/engine/test_system_runs.py runs them through the engine; the device traces are in
test_devices.py, FedBuff's clock in test_async_clock.py)."""
import numpy as np
import pytest

from conftest import write_csv

from fedsim.config import SystemConfig
from fedsim.errors import ConfigError
from fedsim.plan import Population, sample_clients
from fedsim.plan.system import Clock, build_system

N, FRACTION, SEED = 40, 0.25, 7
TARGET = 10  # max(1, round(0.25 x 40))


def clock(seed: int = SEED, work=None, **system) -> Clock:
    cfg = SystemConfig.model_validate({"devices": {"preset": "uniform"}, **system})
    work = np.full(N, 200.0) if work is None else work
    return Clock(build_system(cfg, seed, N), seed, Population(N, fraction=FRACTION), work, bytes_down=1_000_000,
                 bytes_up=500_000)


def test_uniform_devices_select_todays_sample_and_time_each_round_by_its_slowest_client():
    c = clock(work=np.arange(1, N + 1) * 100.0)
    speed, down, up = 100.0, 20e6 / 8, 5e6 / 8  # the defaults: samples/s, bytes/s
    start = 0.0
    for r in range(1, 6):
        t = c.round(r)
        assert list(t.participants) == list(t.selected) == sample_clients(SEED, r, N, FRACTION)
        assert not t.dropouts and not t.late and t.start_s == pytest.approx(start)
        slowest = max(t.participants)  # client c holds (c + 1) x 100 samples
        assert t.seconds == pytest.approx((slowest + 1) * 100 / speed + 1e6 / down + 5e5 / up)
        start = t.end_s


def test_the_clock_is_a_function_of_the_seed_alone_and_recomputes_identically():
    settings = {"devices": {"preset": "lognormal"}, "dropout": 0.2, "over_selection": 0.3, "deadline_s": 30.0,
                "availability": {"pattern": "diurnal", "period_s": 100.0, "on_fraction": 0.6}}
    a, b, other = clock(**settings), clock(**settings), clock(seed=SEED + 1, **settings)
    assert [a.round(r) for r in range(1, 30)] == [b.round(r) for r in range(1, 30)]
    late = clock(**settings)
    assert late.round(29) == a.round(29)  # asked out of order: the same rounds are computed in order
    assert [a.round(r).participants for r in range(1, 30)] != [other.round(r).participants for r in range(1, 30)]


def test_dropouts_happen_at_the_configured_rate_and_never_train():
    c = clock(devices={"preset": "lognormal"}, dropout=0.3)
    rounds = [c.round(r) for r in range(1, 401)]
    selected = sum(len(t.selected) for t in rounds)
    dropped = sum(len(t.dropouts) for t in rounds)
    assert dropped / selected == pytest.approx(0.3, abs=0.02)
    assert all(not set(t.dropouts) & set(t.participants) for t in rounds)
    assert all(set(t.participants) | set(t.dropouts) == set(t.selected) for t in rounds)  # no deadline: the rest report


def test_over_selection_closes_at_the_target_count_and_a_deadline_discards_late_reports():
    c = clock(devices={"preset": "mobile"}, over_selection=0.5, deadline_s=5.0)  # low-end: 12.8 s
    seen_late = seen_cut = False
    for r in range(1, 200):
        t = c.round(r)
        assert len(t.selected) == 15 and len(t.participants) <= TARGET
        times = dict(zip(t.selected, c.durations(np.array(t.selected))))
        assert all(times[p] <= t.seconds + 1e-9 for p in t.participants)
        assert all(times[late] >= max((times[p] for p in t.participants), default=0) for late in t.late)
        if len(t.participants) == TARGET:
            assert t.seconds == pytest.approx(max(times[p] for p in t.participants)) and t.seconds <= 5.0
        else:
            assert t.seconds == 5.0  # too few made it: the round lasted to its deadline
            seen_cut = True
        seen_late |= bool(t.late)
    assert seen_late and seen_cut


def test_diurnal_availability_selects_only_clients_that_are_on_and_waits_for_one():
    c = clock(availability={"pattern": "diurnal", "period_s": 1000.0, "on_fraction": 0.2})
    phase = c.system.availability.phase
    for r in range(1, 60):
        t = c.round(r)
        on = np.mod(t.start_s / 1000.0 + phase, 1.0) < 0.2
        assert on.any() and all(on[s] for s in t.selected)
        assert len(t.selected) == min(TARGET, int(on.sum()))


def test_an_availability_trace_repeats_every_period_and_hostile_ones_are_refused(tmp_path):
    rows = "".join(f"{c},{(c % 4) * 10},{(c % 4) * 10 + 10}\n" for c in range(N))
    trace = write_csv(tmp_path, "on.csv", "client,start_s,end_s\n" + rows)
    c = clock(availability={"pattern": "trace", "trace": trace, "period_s": 40.0})
    previous_end = 0.0
    for r in range(1, 40):
        t = c.round(r)
        quarter = int(t.start_s % 40 // 10)
        assert all(s % 4 == quarter for s in t.selected)
        assert t.start_s == previous_end  # someone is always on: no round waits
        previous_end = t.end_s
    gaps = write_csv(tmp_path, "gaps.csv",
                     "client,start_s,end_s\n" + "".join(f"{c},{30 + c % 2},35\n" for c in range(N)))
    waiting = clock(availability={"pattern": "trace", "trace": gaps, "period_s": 40.0})
    first, second, third = (waiting.round(r) for r in (1, 2, 3))  # each lasts 3.2 s
    assert first.start_s == 30.0 and all(s % 2 == 0 for s in first.selected)  # waits for the first on: the even ones
    assert second.start_s == first.end_s < 35.0  # everyone is on now
    assert second.end_s > 35.0 and third.start_s == 70.0  # nobody on after 35 s: the next cycle's 30 s
    for body, message in [("client,start_s,end_s\n0,5,50\n", "[5, 50) is not an interval within one"),
                          ("client,start_s,end_s\n0,5,1\n", "is not an interval"),
                          ("client,start_s,end_s\n0,0,10\n", "gives client 1 no interval"),
                          ("client,start_s,end_s\n99,0,10\n", "client '99' is not one of")]:
        bad = write_csv(tmp_path, "bad.csv", body)
        with pytest.raises(ConfigError, match="system.availability.trace: ") as err:
            clock(availability={"pattern": "trace", "trace": bad, "period_s": 40.0})
        assert message in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        clock(availability={"pattern": "trace", "trace": str(tmp_path / "absent.csv")})
