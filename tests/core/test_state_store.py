"""Per-client state beyond RAM: a store that spills to memory-mapped files past engine.state_ram_mb gives the
same bits, and incremental checkpoints (deltas between full snapshots) resume exactly, prune safely and fall
back to an older intact checkpoint."""
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import client_runtime, in_process_server, round_records, six_client_run, train_one

from fedsim.algorithms import WEIGHTS
from fedsim.core import checkpoint
from fedsim.core.store import StateMemory
from fedsim.errors import ConfigError

ROUNDS = 4


def _setup(tmp_path, data_root, algorithm, workers, **engine):
    return six_client_run(tmp_path, data_root, algorithm, workers, ROUNDS, eval_every=2, **engine)


def _client_state(server) -> dict[tuple[str, int], bytes]:
    """Every worker's per-client state, bit for bit."""
    return {(name, client): vector.tobytes() for worker in server.pool.workers
            for name, store in worker.runtime.slots.items() for client, vector in store.items()}


@pytest.mark.parametrize("algorithm", ["fedper", "ditto", "scaffold"])
def test_state_spilled_to_disk_is_bit_identical_to_state_in_ram(tmp_path, data_root, monkeypatch, algorithm):
    monkeypatch.setattr(StateMemory, "RELEASE_BYTES", 1)  # drop mapped pages after every row: reads come from the file
    runs = {}
    for budget in (1024, 0):
        spill_dir = tmp_path / f"spill-{budget}"
        server = in_process_server(_setup(tmp_path, data_root, algorithm, 2, state_ram_mb=budget,
                                                         spill_dir=str(spill_dir)))
        server.restore(None)
        runs[budget] = round_records([server.round(r) for r in (1, 2)]), _client_state(server), spill_dir
    (ram_records, ram_state, ram_spill), (disk_records, disk_state, disk_spill) = runs.values()
    assert ram_records == disk_records and ram_state == disk_state and ram_state
    assert not ram_spill.exists()
    # one folder per worker, its files unlinked as soon as they are mapped (nothing is left if a worker is killed)
    folders = list(disk_spill.iterdir())
    assert len(folders) == 2 and not any(list(f.iterdir()) for f in folders)


def test_a_spill_dir_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"^engine.spill_dir: cannot keep .* in .*a-file/state \(.*\); point it at"):
        StateMemory(0, str(tmp_path / "a-file" / "state")).block(2, 3)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_run_resumed_from_an_incremental_checkpoint_equals_an_uninterrupted_one(tmp_path, data_root, monkeypatch,
                                                                                   request, where):
    location = str(tmp_path / "run")
    if where == "s3":
        request.getfixturevalue("s3_bucket")
        location = "s3://fedsim-runs/incremental/run"
    straight = in_process_server(_setup(tmp_path, data_root, "ditto", 2))
    straight.restore(None)
    expected = round_records([straight.round(r) for r in range(1, ROUNDS + 1)])

    first = in_process_server(_setup(tmp_path, data_root, "ditto", 2, full_checkpoint_every=3))
    first.restore(None)
    head = []
    for r in (1, 2, 3):
        head += round_records([first.round(r)])
        ckpt = first.checkpoint(location, r)
    with checkpoint.local_checkpoint(ckpt) as local:  # round 3: a delta over the full round 1 and the delta of round 2
        assert [name for name, _ in json.loads((local / "state.json").read_text())["bases"]] == ["round-0001",
                                                                                                 "round-0002"]
    resumed = in_process_server(_setup(tmp_path, data_root, "ditto", 3, full_checkpoint_every=3))
    assert resumed.restore(ckpt) == 3
    assert head + round_records([resumed.round(4)]) == expected
    assert _client_state(resumed) == _client_state(straight)


def test_a_delta_checkpoint_holds_only_the_clients_trained_since_the_last(tmp_path, data_root):
    rt = client_runtime(data_root, "ditto")
    broadcast = {WEIGHTS: rt.layouts["shared"].pack()}
    for client in range(5):
        train_one(rt, broadcast, client, 1)
    rt.save_state(str(tmp_path / "full.npz"), full=True)
    train_one(rt, broadcast, 2, 2)
    rt.save_state(str(tmp_path / "delta.npz"), full=False)
    rt.save_state(str(tmp_path / "unchanged.npz"), full=False)
    full, delta = (tmp_path / "full.npz").stat().st_size, (tmp_path / "delta.npz").stat().st_size
    assert delta < full / 4
    with np.load(tmp_path / "full.npz") as everyone, np.load(tmp_path / "delta.npz") as changed, \
            np.load(tmp_path / "unchanged.npz") as nothing:
        assert {key.rpartition(".")[2] for key in everyone.files} == {"0", "1", "2", "3", "4"}
        assert changed.files == [key for key in everyone.files if key.endswith(".2")] and nothing.files == []


def _publish(run_dir: Path, round_idx: int, chain: list, state: dict[int, np.ndarray]) -> tuple[Path, list]:
    """A checkpoint as the server writes one, every third full; each round adds client ``round_idx``."""
    bases = checkpoint.next_bases(chain, 3)
    state[round_idx] = np.full(3, round_idx, np.float32)
    staging = checkpoint.staging_dir(run_dir, round_idx)
    written = state if not bases else {round_idx: state[round_idx]}
    checkpoint.write_worker_state(staging / "worker-0.npz", {"personal": written})
    meta = {"fingerprint": "f", **checkpoint.new_links(bases)}
    final = checkpoint.commit(staging, round_idx, np.zeros(4, np.float32), meta)
    return final, checkpoint.links_of(meta, final.name)


def _on_disk(run_dir: Path) -> list[int]:
    return sorted(checkpoint.round_of(p) for p in (run_dir / "checkpoints").glob("round-*"))


def test_pruning_keeps_what_kept_checkpoints_build_on_and_a_broken_base_falls_back(tmp_path):
    chain, state = [], {}
    for r in (1, 2, 3):
        ckpt, chain = _publish(tmp_path, r, chain, state)
    assert _on_disk(tmp_path) == [1, 2, 3]  # round 3 builds on 1 and 2: none may go
    assert checkpoint.read_worker_states(ckpt, {1, 2, 3})["personal"].keys() == {1, 2, 3}
    (tmp_path / "checkpoints" / "round-0002" / "worker-0.npz").write_bytes(b"PK\x03\x04 cut short")
    assert checkpoint.latest(tmp_path).name == "round-0001"  # round 3 is broken through its base

    chain, state = [], {}
    for r in (1, 2, 3, 4):
        ckpt, chain = _publish(tmp_path, r, chain, state)
    assert _on_disk(tmp_path) == [1, 2, 3, 4]  # 4 is full; 3 is kept, and with it its bases
    _publish(tmp_path, 5, chain, state)
    assert _on_disk(tmp_path) == [4, 5]
    state_json = tmp_path / "checkpoints" / "round-0004" / "state.json"
    state_json.write_text(json.dumps({**json.loads(state_json.read_text()), "id": "rewritten"}))
    assert not checkpoint.intact(tmp_path / "checkpoints" / "round-0005")  # a base rewritten since is not mixed in
