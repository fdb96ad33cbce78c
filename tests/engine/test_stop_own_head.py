"""docs/cluster.md's way to stop one's own local Ray head and nothing else, run as written against a head this test
starts (with a --temp-dir and ports of its own), a task's worker included."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from conftest import TESTS

DOCS = TESTS.parent / "docs" / "cluster.md"


def _recipe() -> str:
    block = re.search(r"```bash\n(  # Stop the head started with --temp-dir.*?)  ```", DOCS.read_text(), re.DOTALL)
    assert block, "docs/cluster.md lost its recipe for stopping one's own head"
    return "\n".join(line.removeprefix("  ") for line in block.group(1).splitlines())


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _of_head(temp: str, client: int) -> list[psutil.Process]:
    """Every process whose command line names the head's temp dir or its client server's port, and their children
    (the raylet's agents and workers): found without the recipe's own way of finding them."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if temp in line or ("ray.util.client.server" in line and f"--port={client}" in line.split()):
            found.append(proc)
    return found + [child for proc in found for child in proc.children() if child not in found]


RAY = str(Path(sys.executable).with_name("ray"))  # the environment's own: `make test` does not put .venv/bin on PATH


def test_the_documented_stop_ends_every_process_of_its_head_and_nothing_else():
    temp = tempfile.mkdtemp(prefix="fsr-", dir="/tmp")  # short: Ray's unix sockets live under it (107 bytes)
    gcs, client, agent, low = _free_ports(4)
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started = subprocess.run([RAY, "start", "--head", f"--temp-dir={temp}", f"--port={gcs}", "--include-dashboard=false",
                                   f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
                                  f"--min-worker-port={low + 1}", f"--max-worker-port={low + 40}", "--num-cpus=1"],
                                 env=env, check=True, capture_output=True, text=True, timeout=180)
        said = re.search(r"Local node IP.*?(\d+\.\d+\.\d+\.\d+)", started.stdout + started.stderr)
        assert said, started.stdout + started.stderr
        address = f"{said.group(1)}:{gcs}"
        worker = ("import ray, os; ray.init(log_to_driver=False); "
                  "print(ray.get(ray.remote(lambda: os.getpid()).remote()))")
        ran = subprocess.run([sys.executable, "-c", worker], env={**env, "RAY_ADDRESS": address},
                             capture_output=True, text=True, timeout=180, cwd=temp)
        head = _of_head(temp, client)
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert any(p.name() == "gcs_server" for p in head) and any(p.name() == "raylet" for p in head)
        recipe = _recipe().replace("TEMP=/tmp/ray-$USER-6391 CLIENT_PORT=9011", f"TEMP={temp} CLIENT_PORT={client}")
        script = tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False)  # outside the head's folder
        script.write(recipe)
        script.close()
        stopped = subprocess.run(["bash", script.name], capture_output=True, text=True, timeout=120)
        os.unlink(script.name)
        assert stopped.returncode == 0, stopped.stderr
        time.sleep(1)
        assert [p.pid for p in head if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
        assert bystander.poll() is None  # not one of the head's: untouched
    finally:
        bystander.kill()
        for proc in _of_head(temp, client):  # the test's own head, should the recipe have left any of it
            proc.kill()
        shutil.rmtree(temp, ignore_errors=True)
