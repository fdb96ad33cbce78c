"""Every script under benchmarks/ runs: each one's smoke mode (tiny sizes, seconds; its numbers mean nothing), so a
refactor that breaks a script fails here instead of on the day someone measures (benchmarks/overhead.py's bare loop
once failed for weeks, unnoticed).

Not here: ``gpu_check.py`` and ``gpu_fixedcost.py`` (and the shell scripts around them) need a GPU: their
CPU-checkable parts are in tests/test_gpu_check.py, ``OUT=/tmp/g benchmarks/gpu_check.sh --cpu`` runs the check on CPU
workers and ``gpu_fixedcost.py --cpu`` on the CPU; ``peer_flower.py`` (and ``_flower_app.py``, its Flower side) need
Flower's own environment, benchmarks/.venv-flwr, which pins another Ray: ``peer_flower.py --workloads device --reps 1``
creates it and runs there. ``_common.py`` is every script's helper.

Cost (measured on the shared 2-core VM at load average 10-17, BENCHMARKS.md): the in-process scripts 5-45 s each, the
Ray-based ones (each starts a local Ray, some several) minutes each under that load: those (SLOW_SMOKE) run in the
slow suite, which CI runs beside `make test`."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
ELSEWHERE = {"gpu_check.py", "gpu_fixedcost.py", "peer_flower.py", "_flower_app.py", "_common.py"}

# script -> its arguments in smoke mode; the Ray-based ones start a local Ray (10-30 s each).
SMOKE = {
    "chaos.py": ["--smoke"],
    "gpu_subset.py": ["DATA", "OUT", "--smoke"],
    "lightning_driver.py": ["--smoke"],
    "lora_throughput.py": ["--smoke"],
    "overhead.py": ["--smoke"],
    "packed.py": ["quickstart", "steps", "--smoke"],
    "parallel.py": ["--smoke"],
    "partial_rounds.py": ["--smoke"],
    "population.py": ["--smoke"],
    "profiling.py": ["smoke"],
    "reproduce_projection.py": ["--smoke"],
    "scale.py": ["--smoke"],
    "secagg.py": ["--smoke"],
    "startup.py": ["--smoke"],
    "state_memory.py": ["--smoke"],
    "sweep_concurrency.py": ["--smoke"],
    "system_clock.py": ["--smoke"],
    "text_throughput.py": ["--smoke"],
}


def test_every_script_has_a_smoke_run_here_or_says_where_it_is_checked():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts - ELSEWHERE == set(SMOKE)


# Smoke runs that took 40 s to 7 min each in `make test` at load average 8-15 (the suite's 51 min, 2026-12-07: 33 min
# of it these): they run in `make test-slow`, which CI runs too; the quick ones stay in `make test`.
SLOW_SMOKE = {"chaos.py", "lora_throughput.py", "overhead.py", "packed.py", "parallel.py", "partial_rounds.py",
              "population.py", "profiling.py", "reproduce_projection.py", "scale.py", "sweep_concurrency.py",
              "system_clock.py"}


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SMOKE else s
                                    for s in sorted(SMOKE)])
def test_smoke(script, tmp_path, data_root):
    args = [str(data_root) if a == "DATA" else str(tmp_path / "out") if a == "OUT" else a for a in SMOKE[script]]
    env = {**os.environ, "BENCH_QUIET_WAIT_S": "0",
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
