"""Resource requests and Ray's waits (issue 47, item 2): workers a local run's machine could never hold are refused
in one line, exit 2, before Ray starts (before, ``ray.init(num_cpus=1e9)`` never returned and ignored Ctrl-C); a
start of Ray that does not finish gives up after a bounded wait with one line naming what it waited for."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import pytest
from conftest import cli_env, synthetic_tree, write_yaml

import fedsim.engine.ray_cluster as ray_cluster
import fedsim.engine.ray_start as ray_start
from fedsim.config import validate
from fedsim.errors import ConfigError, RayUnavailable


def _refused(tmp_path: Path, *overrides: str) -> tuple[int, list[str], list[str]]:
    """`fedsim run` of a tiny synthetic config with ``overrides``: (exit code, stderr lines, what its private Ray
    temp folder holds). A run that does not end within 150 s (the hang this guards against) is killed whole."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="fcl", dir="/tmp"))
    cfg = write_yaml(tmp_path / "run.yaml", synthetic_tree(tmp_path, "big", engine__backend="ray", train__rounds=1))
    proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli.main", "run", str(cfg), "--quiet", *overrides],
                            env=cli_env(TMPDIR=str(ray_tmp)), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    finally:
        started = sorted(p.name for p in (ray_tmp / "ray").iterdir()) if (ray_tmp / "ray").exists() else []
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return proc.returncode, err.strip().splitlines(), started


def test_a_billion_cpus_per_worker_is_refused_before_ray_starts(tmp_path):
    code, lines, started = _refused(tmp_path, "engine.cpus_per_worker=1000000000")
    assert code == 2 and len(lines) == 1, lines[-20:]
    assert lines[0].startswith("fedsim: error: engine.cpus_per_worker: 1e+09 CPUs per worker, this machine has "), lines
    assert started == [] and not (tmp_path / "big").exists()


def test_a_billion_workers_over_a_million_clients_is_refused_before_the_data_loads(tmp_path):
    """A million clients' data and a billion worker processes: refused in one line before any data is generated or
    Ray starts. The data's own check comes first now (``fedsim run`` checks the partition before torch and Ray
    load, issue 68): the synthetic set makes at most 10,000 clients."""
    code, lines, started = _refused(tmp_path, "engine.workers=1000000000", "data.num_clients=1000000",
                                    "data.options.num_clients=1000000")
    assert code == 2 and len(lines) == 1, lines[-20:]
    assert lines[0].startswith("fedsim: error: data.options.num_clients: synthetic makes 1 to 10,000 clients"), lines
    assert started == [] and not (tmp_path / "big").exists()


def test_more_workers_than_this_machine_holds_are_refused_with_the_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_cluster.psutil, "virtual_memory", lambda: types.SimpleNamespace(total=2**30))  # 1 GB
    monkeypatch.setattr(ray_cluster.os, "cpu_count", lambda: 4)
    cfg = validate(synthetic_tree(tmp_path, engine__workers=8))  # 8 clients
    with pytest.raises(ConfigError, match=r"^engine.workers: 8 worker processes need at least 2 GB of memory "
                                          r"\(256 MB each\), this machine has 1 GB; give at most 4 workers"):
        ray_cluster.refuse_beyond_this_machine(cfg)
    ray_cluster.refuse_beyond_this_machine(validate(synthetic_tree(tmp_path, engine__workers=4, engine__cpus_per_worker=4)))


def test_a_ray_start_that_never_finishes_gives_up_naming_what_it_waited_for(tmp_path, monkeypatch):
    """ray.init stands in for one that blocks (in Ray, in C code that no signal handler interrupts)."""
    blocked = threading.Event()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(ray_cluster, "ray", types.SimpleNamespace(is_initialized=lambda: False,
                                                                  init=lambda **kwargs: blocked.wait(2)))
    monkeypatch.setattr(ray_cluster, "refuse_stale_ray_settings", lambda: None)
    monkeypatch.setattr(ray_cluster.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ray_start, "RAY_START_TIMEOUT_S", 0.5)
    started, held = time.monotonic(), len(ray_start._STARTED)
    with pytest.raises(RayUnavailable, match=r"^Ray did not start within 0.5 s \(starting a local Ray with 2 CPUs\)"):
        ray_cluster.connect_ray(validate(synthetic_tree(tmp_path, engine__workers=2)))
    blocked.set()
    assert time.monotonic() - started < 30  # bounded (the abandoned start is given at most GRACE_S to end)
    assert len(ray_start._STARTED) == held  # nothing kept of a start given up


def test_attaching_to_a_cluster_that_does_not_answer_gives_up(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(ray_cluster, "ray", types.SimpleNamespace(is_initialized=lambda: False,
                                                                  init=lambda **kwargs: time.sleep(1)))
    monkeypatch.setattr(ray_start, "RAY_START_TIMEOUT_S", 0.2)
    with pytest.raises(RayUnavailable, match=r"\(attaching to the Ray cluster at 10.0.0.1:6379\)"):
        ray_cluster.connect_ray(validate(synthetic_tree(tmp_path)))


def test_a_sweep_variant_beyond_this_machine_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """Ray is sized for the sweep's largest variants, which need not be its first."""
    from fedsim.sweep import executor

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(executor, "connect_ray", lambda *a, **k: pytest.fail("Ray was started"))
    small, huge = (validate(synthetic_tree(tmp_path, engine__cpus_per_worker=cpus)) for cpus in (1, 1e9))
    with pytest.raises(ConfigError, match=r"^engine.cpus_per_worker: 1e\+09 CPUs per worker, this machine has"):
        executor.connect([small, huge], None)
