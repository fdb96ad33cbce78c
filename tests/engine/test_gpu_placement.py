"""GPU fractions with fake GPU resources: no real GPU needed."""
import pytest
import ray

from fedsim.config import validate
from fedsim.engine import placement
from fedsim.engine.ray_cluster import check_resources
from fedsim.errors import ConfigError


@pytest.fixture
def fake_gpu_ray(no_ray):
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="warning",
             log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(tmp_path, data_root, workers, gpus):
    return validate({"out_dir": str(tmp_path), "data": {"root": str(data_root), "num_clients": 4, "k": 3,
                                                        "train_fraction": 0.01, "test_fraction": 0.01},
                     "engine": {"workers": workers, "cpus_per_worker": 0.5, "gpus_per_worker": gpus}})


def test_four_workers_share_one_gpu(tmp_path, data_root, fake_gpu_ray):
    from conftest import plan_for

    from fedsim.client.worker import spawn_worker
    from fedsim.engine.backend import start_engine

    cfg = _cfg(tmp_path, data_root, workers=4, gpus=0.25)
    check_resources(cfg)
    plan = plan_for(cfg)
    group = placement.reserve(cfg, 4)  # the run's placement group: four (0.5 CPU, 0.25 GPU) bundles
    refs = ray.put(plan), ray.put(plan.for_workers())
    server = start_engine(plan, refs, spawn_worker, placement.bundles(group, 4))
    infos = ray.get(server.worker_info.remote())  # blocks until all four actors have started
    assert len(infos) == 4
    assert all(i["gpu_ids"] == [0] or i["gpu_ids"] == ["0"] for i in infos)
    assert all(i["cuda_visible_devices"] == "0" for i in infos)
    assert all(i["device"] == "cpu" for i in infos)  # no real CUDA here: the same code falls back to CPU
    ray.get(server.shutdown.remote())
    placement.release(group)


def test_requesting_more_gpus_than_exist_is_a_clear_error(tmp_path, data_root, fake_gpu_ray):
    with pytest.raises(ConfigError, match="engine.gpus_per_worker: 3 workers x 0.5 need 1.5 GPU"):
        check_resources(_cfg(tmp_path, data_root, workers=3, gpus=0.5))
