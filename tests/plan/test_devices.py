"""Client devices read from CSV traces: each client's device and class, and every malformed trace refused in one
line naming the file and line (the availability trace is tested through the clock, tests/plan/test_system.py)."""
import pytest

from conftest import write_csv

from fedsim.config import SystemConfig
from fedsim.errors import ConfigError
from fedsim.plan.system import build_system

N, SEED = 40, 7


def test_a_device_trace_gives_each_client_its_device_and_class(tmp_path):
    rows = "".join(f"{c},{10 + c},{1 + c % 3},{4},{'phone' if c % 2 else 'tablet'}\n" for c in range(N))
    trace = write_csv(tmp_path, "devices.csv", "client,speed,up_mbps,down_mbps,class\n" + rows)
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
    trace = write_csv(tmp_path, "devices.csv", body)
    with pytest.raises(ConfigError, match="system.devices.trace: ") as err:
        build_system(SystemConfig.model_validate({"devices": {"trace": trace}}), SEED, N)
    assert message in str(err.value) and "\n" not in str(err.value)
