"""Checkpoint files without Ray: pruning by round number, `latest` never dangling, fallback to the newest
intact checkpoint, and what the fingerprint covers."""
from pathlib import Path

import numpy as np

from fedsim.config import resume_fingerprint, validate
from fedsim.core import checkpoint


def publish(run_dir: Path, round_idx: int) -> Path:
    staging = checkpoint.staging_dir(run_dir, round_idx)
    checkpoint.write_worker_state(staging / "worker-0.npz", {"personal": {0: np.full(3, round_idx, np.float32)}})
    return checkpoint.commit(staging, round_idx, np.full(4, round_idx, np.float32), {"fingerprint": "f"})


def rounds_on_disk(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("round-*"))


def test_pruning_keeps_the_newest_rounds_past_9999(tmp_path):
    for r in (9998, 9999, 10000, 10001):
        publish(tmp_path, r)
    assert rounds_on_disk(tmp_path) == ["round-10000", "round-10001"]
    assert checkpoint.latest(tmp_path).name == "round-10001"


def test_latest_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    for r in (1, 2):
        publish(tmp_path, r)
    (tmp_path / "checkpoints" / "round-0002" / "worker-0.npz").write_bytes(b"PK\x03\x04 cut short")
    assert checkpoint.latest(tmp_path).name == "round-0001"


def test_latest_survives_a_missing_or_dangling_pointer(tmp_path):
    for r in (3, 4):
        publish(tmp_path, r)
    pointer = tmp_path / "checkpoints" / "latest"
    pointer.write_text("round-0007")
    assert checkpoint.latest(tmp_path).name == "round-0004"
    pointer.unlink()
    assert checkpoint.latest(tmp_path).name == "round-0004"
    pointer.write_text("../../elsewhere")
    assert checkpoint.latest(tmp_path).name == "round-0004"


def test_incomplete_folder_is_skipped_and_none_means_round_zero(tmp_path):
    publish(tmp_path, 1)
    (tmp_path / "checkpoints" / "round-0001" / "state.json").unlink()
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.latest(tmp_path / "never-ran") is None


def test_stale_later_checkpoints_are_pruned_when_a_run_redoes_those_rounds(tmp_path):
    for r in (1, 2, 3):
        publish(tmp_path, r)
    publish(tmp_path, 2)  # after falling back to round 1: round 3 is from before, and is being redone
    assert rounds_on_disk(tmp_path) == ["round-0002"]
    assert checkpoint.latest(tmp_path).name == "round-0002"


def test_fingerprint_ignores_logging_and_rounds_but_not_training():
    base = validate({"data": {"dataset": "synthetic", "partition": "natural"}, "model": {"name": "mlp"}}).model_dump()
    fp = resume_fingerprint(base)
    wandb_id = {**base, "logging": {"wandb": {**base["logging"]["wandb"], "run_id": "abc123"}}}
    longer = {**base, "train": {**base["train"], "rounds": 99}}
    other_seed = {**base, "seed": 1}
    assert resume_fingerprint(wandb_id) == fp
    assert resume_fingerprint(longer) == fp
    assert resume_fingerprint(other_seed) != fp
    # The values fedsim wrote into checkpoints before "settings that change results" had one definition
    # (commit 342c3ba): run folders from then still resume.
    assert fp == "3e724a45d7300624" and resume_fingerprint(validate({}).model_dump()) == "6cbcd4f1f63f219c"
    # Keys added since (the virtual clock, held-out clients) count once set.
    assert resume_fingerprint({**base, "eval": {**base["eval"], "unseen": 2}}) != fp
    assert resume_fingerprint({**base, "eval": {**base["eval"], "personalize": "own_update"}}) != fp
    assert resume_fingerprint({**base, "system": {**base["system"], "devices": {"preset": "uniform"}}}) != fp
