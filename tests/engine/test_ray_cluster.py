"""Ray for a run (fedsim/engine/ray_cluster.py): a local Ray sized for the workers the run starts, and the token
file kept private."""
import types

import pytest

from conftest import synthetic_tree

import fedsim.engine.ray_cluster as ray_cluster
import fedsim.engine.ray_start as ray_start
from fedsim.config import validate


def test_a_local_ray_is_sized_for_the_workers_the_run_starts(tmp_path, monkeypatch):
    """engine.workers beyond the clients start no worker (``plan.worker_count``), so they reserve no CPUs either."""
    started = {}
    _stand_in_ray(monkeypatch, tmp_path, init=lambda **kwargs: started.update(kwargs))
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


DRIVER = """
import fedsim
import ray
from fedsim.config import validate
from fedsim.engine.ray_cluster import connect_ray

connect_ray(validate({"engine": {"workers": 1}}))


@ray.remote(num_cpus=0)
def imported():
    import fedsim
    return fedsim.__file__


print(fedsim.__file__)
print(ray.get(imported.remote(), timeout=120))
ray.shutdown()
"""


def test_workers_import_fedsim_from_where_the_driver_does_not_from_the_folder_it_ran_in(tmp_path, no_ray):
    """Issue 46 item 6: Ray puts the driver's working folder ahead of PYTHONPATH on its workers; run from a folder
    holding an old copy of fedsim, with the real one on PYTHONPATH (as the `fedsim` command runs: its own folder,
    not the working one, first on sys.path), the workers import the driver's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    old = tmp_path / "project"
    (old / "fedsim").mkdir(parents=True)
    (old / "fedsim" / "__init__.py").write_text("OLD = True\n")
    script = tmp_path / "bin" / "driver.py"
    script.parent.mkdir()
    script.write_text(DRIVER)
    real = Path(ray_cluster.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(real)}
    proc = subprocess.run([sys.executable, str(script)], cwd=old, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    driver, worker = proc.stdout.split()[-2:]
    assert driver == worker == str(real / "fedsim" / "__init__.py")


def _stand_in_ray(monkeypatch, tmp_path, init):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(ray_cluster, "ray", types.SimpleNamespace(is_initialized=lambda: False, init=init,
                                                                  shutdown=lambda: None))
    monkeypatch.setattr(ray_cluster, "refuse_stale_ray_settings", lambda: None)
    monkeypatch.setattr(ray_cluster.os, "cpu_count", lambda: 2)


def test_a_local_start_that_rays_node_wait_gave_up_is_tried_again(tmp_path, monkeypatch, capsys):
    """Ray's raylet has a hard-coded 30 s to register (ray/_private/node.py); a loaded machine can miss it once."""
    tries = []

    def init(**kwargs):
        tries.append(kwargs)
        if len(tries) == 1:
            raise Exception(ray_cluster.NODE_START_TIMED_OUT + ". This could happen because some of the raylet ...")

    _stand_in_ray(monkeypatch, tmp_path, init)
    ray_cluster.connect_ray(validate(synthetic_tree(tmp_path, engine__workers=2)))
    ray_start._STARTED.pop().release.set()
    assert len(tries) == 2
    assert "did not register within its 30 s (starting a local Ray with 2 CPUs, try 1 of 3)" in capsys.readouterr().err


def test_a_local_start_is_tried_at_most_three_times_and_other_failures_not_again(tmp_path, monkeypatch):
    tries = []

    def init(**kwargs):
        tries.append(kwargs)
        raise Exception(ray_cluster.NODE_START_TIMED_OUT)

    _stand_in_ray(monkeypatch, tmp_path, init)
    held = len(ray_start._STARTED)
    with pytest.raises(Exception, match=ray_cluster.NODE_START_TIMED_OUT):
        ray_cluster.connect_ray(validate(synthetic_tree(tmp_path, engine__workers=2)))
    assert len(tries) == ray_cluster.LOCAL_START_TRIES == 3 and len(ray_start._STARTED) == held

    tries.clear()

    def broken(**kwargs):
        tries.append(kwargs)
        raise ValueError("some other start failure")

    _stand_in_ray(monkeypatch, tmp_path, broken)
    with pytest.raises(ValueError, match="some other start failure"):
        ray_cluster.connect_ray(validate(synthetic_tree(tmp_path, engine__workers=2)))
    assert len(tries) == 1
