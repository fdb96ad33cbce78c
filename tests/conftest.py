import os
from pathlib import Path

import pytest

import fedsim  # noqa: F401  - sets Ray's local-run defaults (loopback, token auth) before any test imports ray

os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The shared real data (FEDSIM_DATA). `make test` sets it; without it, data tests skip."""
    root = os.environ.get("FEDSIM_DATA")
    if not root or not (Path(root) / "cifar10-jpeg.zip").exists():
        pytest.skip("set FEDSIM_DATA to the folder holding cifar10-jpeg.zip (make test does this)")
    return Path(root)


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    yield ray
    ray.shutdown()
