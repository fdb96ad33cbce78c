"""Run folders in an object store (a moto S3 server on loopback), and waiting for cluster resources."""
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import s3_objects, small_config

from fedsim import storage
from fedsim.core import checkpoint
from fedsim.engine import placement
from fedsim.errors import ConfigError, StorageError

RUN = "s3://fedsim-runs/unit/run"


def _write_round(round_idx: int, value: float) -> str:
    staging = checkpoint.begin(RUN, round_idx)
    with storage.local_output(storage.join(staging, "worker-0.npz")) as path:  # as a worker does
        checkpoint.write_worker_state(path, {"personal": {3: np.full(4, value, np.float32)}})
    return staging


def test_checkpoint_in_a_bucket_is_complete_before_latest_names_it(s3_bucket):
    _, s3 = s3_bucket
    staging = _write_round(1, 1.0)
    assert "latest" not in s3_objects(s3, "unit/run/checkpoints/")  # shards are there, the checkpoint is not yet
    published = checkpoint.finish(staging, 1, np.zeros(5, np.float32), {"fingerprint": "f"}, ["worker-0.npz"],
                                  {"momentum": np.ones(5, np.float32)})
    stored = s3_objects(s3, "unit/run/checkpoints/")
    assert stored["latest"] == b"round-0001"
    assert json.loads(stored["round-0001/state.json"])["workers"] == ["worker-0.npz"]
    with storage.local_folder(published) as local:  # what a resuming server and worker read
        state, global_vector, server_state = checkpoint.read_state(local, "f", 5)
        assert checkpoint.read_worker_states(local, {3})["personal"][3].tolist() == [1.0] * 4
    assert state["round"] == 1 and global_vector.tolist() == [0.0] * 5 and server_state["momentum"].sum() == 5


def test_bucket_keeps_the_two_newest_checkpoints(s3_bucket):
    _, s3 = s3_bucket
    for round_idx in (1, 2, 3):
        checkpoint.finish(_write_round(round_idx, round_idx), round_idx, np.zeros(5, np.float32), {}, ["worker-0.npz"])
    # (pyarrow also leaves empty "folder/" marker objects, named "" here)
    rounds = {name.split("/")[0] for name in s3_objects(s3, "unit/run/checkpoints/") if name not in ("", "latest")}
    assert rounds == {"round-0002", "round-0003"}


def test_report_and_resume_read_a_run_folder_from_its_uri(s3_bucket, tmp_path):
    storage.Store(RUN).write_bytes("config.yaml", b"name: ignored\nseed: 4\nalgorithm: fedavg\n")
    from fedsim.engine.runfolder_checks import load_run_config

    cfg = load_run_config(RUN, ["train.rounds=7"])
    assert (cfg.name, cfg.out_dir, cfg.seed, cfg.train.rounds) == ("run", "s3://fedsim-runs/unit", 4, 7)
    with pytest.raises(ConfigError, match="not a run folder"):
        load_run_config("s3://fedsim-runs/unit/missing")


def test_a_request_the_cluster_cannot_hold_waits_saying_so_then_fails_naming_the_setting(
        tmp_path, data_root, local_ray, capfd):
    cfg = small_config(tmp_path, data_root, engine__workers=3, engine__wait_for_resources_s=2)
    with pytest.raises(ConfigError, match=r"engine.wait_for_resources_s: .* no room for 3 workers x \(1 CPU\)"):
        placement.reserve(cfg, 3)  # local_ray has 2 CPUs
    assert "fedsim: waiting for the cluster to make room for 3 workers x (1 CPU)" in capfd.readouterr().err
    group = placement.reserve(cfg, 2)  # the failed request left nothing reserved behind
    placement.release(group)


def test_report_reads_run_folders_from_the_bucket(s3_bucket, tmp_path):
    from conftest import make_run

    from fedsim.cli.main import main

    for name, algorithm in (("quick-fedavg", "fedavg"), ("quick-fedper", "fedper")):
        local = make_run(tmp_path / "local", name, algorithm, [[0.5, 0.6], [0.6, 0.7]])
        store = storage.Store(f"s3://fedsim-runs/runs/{name}")
        for path in local.iterdir():
            store.upload(path, path.name)
    assert main(["report", "s3://fedsim-runs/runs/quick-fedavg", "s3://fedsim-runs/runs/quick-fedper",
                 "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "report.md").read_text()
    assert "quick-fedavg" in table and "quick-fedper" in table


@pytest.mark.parametrize("out_dir, message", [
    ("s3://", "names no bucket; give s3://BUCKET/prefix"), ("s3:///runs", "names no bucket"),
    ("s3:bucket/runs", "names no bucket"), ("ftp://host/runs", "names the ftp:// scheme"),
])
def test_an_out_dir_that_is_no_folder_and_no_reachable_store_is_one_line(out_dir, message):
    from fedsim.config import validate
    from fedsim.errors import ConfigError

    with pytest.raises(ConfigError, match=f"out_dir: .*{message}") as err:
        validate({"out_dir": out_dir})
    assert "\n" not in str(err.value)


def test_a_file_uri_is_a_path(tmp_path):
    from fedsim.config import validate

    assert validate({"out_dir": f"file://{tmp_path}/runs"}).out_dir == f"{tmp_path}/runs"


def test_a_store_that_does_not_answer_is_one_line_within_the_deadline(monkeypatch):
    import time

    from fedsim import storage

    monkeypatch.setattr(storage, "ANSWER_TIMEOUT_S", 2)
    start = time.monotonic()
    with pytest.raises(StorageError, match="out_dir: gs://fedsim-no-such-bucket-0/runs") as err:
        storage.Store("gs://fedsim-no-such-bucket-0/runs")
    assert time.monotonic() - start < 10 and "\n" not in str(err.value)


def test_a_folder_under_the_user_dir_is_recorded_relative_to_it(tmp_path, monkeypatch):
    """What a record stores (a kept run's out_dir, model.init_from) names the same folder on every clone."""
    monkeypatch.delenv(storage.USER_DIR_ENV, raising=False)
    (tmp_path / "clone").mkdir()
    monkeypatch.chdir(tmp_path / "clone")
    assert storage.portable(tmp_path / "clone" / "runs" / "reproduce") == Path("runs/reproduce")
    assert storage.portable("runs/../runs") == Path("runs")
    assert storage.portable(tmp_path / "elsewhere") == tmp_path.resolve() / "elsewhere"  # outside: absolute
    # A Ray process reads the driver's directory from the environment: the same record there.
    monkeypatch.setenv(storage.USER_DIR_ENV, str(tmp_path))
    assert storage.portable(tmp_path / "clone" / "runs") == Path("clone/runs")
    assert storage.user_path(storage.portable(tmp_path / "clone" / "runs")) == tmp_path / "clone" / "runs"
