"""Ray for a run (fedsim/engine/ray_cluster.py): a local Ray sized for the workers the run starts, and the token
file kept private."""
import types

from conftest import synthetic_tree

import fedsim.engine.ray_cluster as ray_cluster
import fedsim.engine.ray_start as ray_start
from fedsim.config import validate


def test_a_local_ray_is_sized_for_the_workers_the_run_starts(tmp_path, monkeypatch):
    """engine.workers beyond the clients start no worker (``plan.worker_count``), so they reserve no CPUs either."""
    started = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(ray_cluster, "ray", types.SimpleNamespace(is_initialized=lambda: False,
                                                                  init=lambda **kwargs: started.update(kwargs)))
    monkeypatch.setattr(ray_cluster, "refuse_stale_ray_settings", lambda: None)
    monkeypatch.setattr(ray_cluster.os, "cpu_count", lambda: 2)
    cfg = validate(synthetic_tree(tmp_path, engine__workers=20, engine__cpus_per_worker=2))  # 8 clients
    ray_cluster.connect_ray(cfg)
    ray_start._STARTED.pop().release.set()  # the thread that started the stand-in Ray ends
    assert started["num_cpus"] == 8 * 2 and started["address"] == "local"


def test_the_ray_token_is_made_private(tmp_path, monkeypatch):
    folder = tmp_path / "ray"
    folder.mkdir(mode=0o755)
    token = folder / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)
    folder.chmod(0o755)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    ray_cluster.private_token()
    assert folder.stat().st_mode & 0o777 == 0o700 and token.stat().st_mode & 0o777 == 0o600
