"""The virtual clock: devices, availability, dropouts, over-selection and deadlines as pure functions of the seed
and the config (tests/engine/test_system_runs.py runs them through the engine)."""
import numpy as np
import pytest

from fedsim.config import SystemConfig
from fedsim.errors import ConfigError
from fedsim.plan import sample_clients
from fedsim.plan.system import AsyncClock, Clock, build_system

N, FRACTION, SEED = 40, 0.25, 7
TARGET = 10  # max(1, round(0.25 x 40))


def clock(seed: int = SEED, work=None, **system) -> Clock:
    cfg = SystemConfig.model_validate({"devices": {"preset": "uniform"}, **system})
    work = np.full(N, 200.0) if work is None else work
    return Clock(build_system(cfg, seed, N), seed, FRACTION, work, bytes_down=1_000_000, bytes_up=500_000,
                 trainable=np.ones(N, bool))


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


def _csv(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_device_trace_gives_each_client_its_device_and_class(tmp_path):
    rows = "".join(f"{c},{10 + c},{1 + c % 3},{4},{'phone' if c % 2 else 'tablet'}\n" for c in range(N))
    trace = _csv(tmp_path, "devices.csv", "client,speed,up_mbps,down_mbps,class\n" + rows)
    system = build_system(SystemConfig.model_validate({"devices": {"trace": trace}}), SEED, N)
    assert system.devices.speed[5] == 15 and system.devices.up_bytes_s[5] == 3e6 / 8
    assert system.devices.kind[:2] == ("tablet", "phone")


@pytest.mark.parametrize("body, message", [
    ("client,speed,up_mbps,down_mbps\n", "has no rows"),
    ("client,speed,up\n0,1,1\n", "has no column 'up_mbps'"),
    ("client,speed,up_mbps,down_mbps\n0,-3,1,1\n", "line 2: speed is '-3'; give a positive number"),
    ("client,speed,up_mbps,down_mbps\n0,nan,1,1\n", "line 2: speed is 'nan'"),
    ("client,speed,up_mbps,down_mbps\n40,1,1,1\n", "line 2: client '40' is not one of the run's clients 0..39"),
    ("client,speed,up_mbps,down_mbps\nphone,1,1,1\n", "client 'phone' is not one of"),
    ("client,speed,up_mbps,down_mbps\n0,1,1,1\n0,1,1,1\n", "line 3: client 0 appears twice"),
    ("client,speed,up_mbps,down_mbps\n0,1,1,1\n", "has no row for client 1 (39 of 40 clients missing)"),
])
def test_hostile_device_traces_are_one_line_naming_the_file_and_line(tmp_path, body, message):
    trace = _csv(tmp_path, "devices.csv", body)
    with pytest.raises(ConfigError, match="system.devices.trace: ") as err:
        build_system(SystemConfig.model_validate({"devices": {"trace": trace}}), SEED, N)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_availability_trace_repeats_every_period_and_hostile_ones_are_refused(tmp_path):
    rows = "".join(f"{c},{(c % 4) * 10},{(c % 4) * 10 + 10}\n" for c in range(N))
    trace = _csv(tmp_path, "on.csv", "client,start_s,end_s\n" + rows)
    c = clock(availability={"pattern": "trace", "trace": trace, "period_s": 40.0})
    previous_end = 0.0
    for r in range(1, 40):
        t = c.round(r)
        quarter = int(t.start_s % 40 // 10)
        assert all(s % 4 == quarter for s in t.selected)
        assert t.start_s == previous_end  # someone is always on: no round waits
        previous_end = t.end_s
    gaps = _csv(tmp_path, "gaps.csv", "client,start_s,end_s\n" + "".join(f"{c},{30 + c % 2},35\n" for c in range(N)))
    waiting = clock(availability={"pattern": "trace", "trace": gaps, "period_s": 40.0})
    first, second, third = (waiting.round(r) for r in (1, 2, 3))  # each lasts 3.2 s
    assert first.start_s == 30.0 and all(s % 2 == 0 for s in first.selected)  # waits for the first on: the even ones
    assert second.start_s == first.end_s < 35.0  # everyone is on now
    assert second.end_s > 35.0 and third.start_s == 70.0  # nobody on after 35 s: the next cycle's 30 s
    for body, message in [("client,start_s,end_s\n0,5,50\n", "[5, 50) is not an interval within one"),
                          ("client,start_s,end_s\n0,5,1\n", "is not an interval"),
                          ("client,start_s,end_s\n0,0,10\n", "gives client 1 no interval"),
                          ("client,start_s,end_s\n99,0,10\n", "client '99' is not one of")]:
        bad = _csv(tmp_path, "bad.csv", body)
        with pytest.raises(ConfigError, match="system.availability.trace: ") as err:
            clock(availability={"pattern": "trace", "trace": bad, "period_s": 40.0})
        assert message in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        clock(availability={"pattern": "trace", "trace": str(tmp_path / "absent.csv")})


def async_clock(concurrency: int = 8, buffer: int = 4, seed: int = SEED, **system) -> AsyncClock:
    cfg = SystemConfig.model_validate({"devices": {"preset": "lognormal", "sigma": 1.0}, "mode": "async", **system})
    return AsyncClock(build_system(cfg, seed, N), seed, FRACTION, np.full(N, 200.0), 1_000_000, 500_000,
                      np.ones(N, bool), concurrency=concurrency, buffer=buffer)


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
