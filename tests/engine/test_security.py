"""A local run's Ray is private: every port it listens on is bound to loopback, and even over loopback a
client without Ray's auth token is refused."""
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import ray
from conftest import each_round

from fedsim.config import validate
from fedsim.simulate import run

RAY = str(Path(sys.executable).with_name("ray"))
# A GCS call that returns cluster data (every node's address): what an intruder would ask first.
GCS_NODE_LIST = "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"


def _listening_addresses() -> list[tuple[str, str, int]]:
    """(process name, address, port) of every socket listening in this test's own Ray (its child processes)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            found += [(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:  # a short-lived helper that exited meanwhile
            continue
    return found


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def _gcs_answer(gcs_address: str, token: str | None) -> str:
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(gcs_address) as channel:
        try:
            channel.unary_unary(GCS_NODE_LIST)(b"", timeout=30, metadata=metadata)
        except grpc.RpcError as err:
            return err.code().name
    return "OK"


def test_local_run_listens_on_loopback_only_and_refuses_clients_without_the_token(tmp_path, data_root, no_ray):
    cfg = validate({"name": "private", "algorithm": "fedavg", "out_dir": str(tmp_path),
                    "data": {"root": str(data_root), "num_clients": 2, "partition": "iid", "train_fraction": 0.01, "test_fraction": 0.02},
                    "train": {"rounds": 1, "local_epochs": 1}, "eval": {"finetune_epochs": 0},
                    "engine": {"workers": 2, "round_timeout_s": 300}})
    seen = {}

    def inspect_during_the_run(_result) -> None:
        gcs = ray.get_runtime_context().gcs_address
        token = subprocess.run([RAY, "get-auth-token"], capture_output=True, text=True, timeout=60).stdout.strip()
        seen.update(listening=_listening_addresses(), gcs=gcs, without_token=_gcs_answer(gcs, None),
                    with_token=_gcs_answer(gcs, token))

    try:
        run(cfg, callbacks=[each_round(inspect_during_the_run)])
    finally:
        ray.shutdown()
    names = {name for name, _, _ in seen["listening"]}
    assert {"gcs_server", "raylet"} <= names, names  # the probe saw the run's Ray, workers included
    assert any(name.startswith("ray::") for name in names), names
    exposed = [entry for entry in seen["listening"] if not _is_loopback(entry[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert _is_loopback(seen["gcs"].rpartition(":")[0])
    assert seen["without_token"] == "UNAUTHENTICATED"
    assert seen["with_token"] == "OK"  # the same call with the token works: the refusal is the token's doing


def test_ray_imported_before_fedsim_is_refused_in_one_line_before_ray_starts(tmp_path):
    """Ray reads its loopback and token settings at import: imported first, it misses fedsim's. Ray would then
    retry for a minute and raise an AuthenticationError naming neither cause; fedsim names the import order."""
    from conftest import synthetic_tree, write_yaml

    config = write_yaml(tmp_path / "c.yaml", synthetic_tree(tmp_path, "early", engine__backend="ray", train__rounds=1))
    script = ("import ray\nimport sys\nfrom fedsim.config import load_tree, validate\nfrom fedsim.errors import ConfigError\n"
              "from fedsim.simulate import run\n"
              "try:\n    run(validate(load_tree(sys.argv[1])))\nexcept ConfigError as err:\n    print('refused:', err)\n"
              "print('ray started:', ray.is_initialized())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", script, str(config)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: ray was imported before fedsim" in out.stdout and "import fedsim before ray" in out.stdout
    assert "ray started: False" in out.stdout and not (tmp_path / "early").exists()
