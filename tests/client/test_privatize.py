"""fedsim/client/privatize.py: each client's update of the shared part clipped (and under local DP noised) on the
worker before the exact sum stages it; personal parts untouched."""
import numpy as np
import pytest
import torch
from conftest import in_process_server, synthetic_tree

from fedsim.client.privatize import clipped
from fedsim.client.reduce import ClientSums, Trained
from fedsim.config import validate
from fedsim.core.protocol import WEIGHTS

CLIP = 0.05


def trained(upload: np.ndarray) -> Trained:
    return Trained(10, torch.tensor(0.5), {WEIGHTS: torch.from_numpy(upload.astype(np.float32))}, {}, {})


def test_an_update_beyond_the_clip_norm_is_scaled_onto_it_and_one_within_is_left_bit_for_bit():
    rng = np.random.default_rng(0)
    start = rng.standard_normal(100).astype(np.float32)
    started_from = torch.from_numpy(start).double()
    far = clipped(trained(start + 3 * rng.standard_normal(100).astype(np.float32)), started_from, 1.0, None)
    update = far.uploads[WEIGHTS].double() - started_from
    assert float(update.norm()) == pytest.approx(1.0, abs=1e-5) and float(far.update_norm) > 20
    near_upload = start + np.float32(1e-3) * rng.standard_normal(100).astype(np.float32)
    near = clipped(trained(near_upload), started_from, 1.0, None)
    assert np.array_equal(near.uploads[WEIGHTS].numpy(), near_upload)
    assert clipped(trained(start), started_from, 1.0, None).uploads[WEIGHTS].isfinite().all()  # a zero update


def test_local_noise_is_added_to_the_clipped_update():
    start = np.zeros(4, np.float32)
    noise = np.array([0.5, -0.25, 0.0, 1.0])
    out = clipped(trained(np.array([3.0, 4.0, 0.0, 0.0])), torch.from_numpy(start).double(), 1.0, noise)
    assert np.allclose(out.uploads[WEIGHTS].numpy(), np.array([0.6, 0.8, 0.0, 0.0]) + noise)


def dp_config(tmp_path, dp="central", algorithm="fedper", **over):
    tree = synthetic_tree(tmp_path, **{"algorithm": algorithm, "engine.workers": 2, "train.weighting": "uniform",
                                       "train.rounds": 2, "train.local_epochs": 2, **over})
    tree["privacy"] = {"dp": dp, "noise_multiplier": 1.0, "clip_norm": CLIP}
    return validate(tree)


@pytest.mark.parametrize("dp", ["central", "local"])
def test_every_staged_update_is_within_the_clip_norm_in_a_real_run(tmp_path, monkeypatch, dp):
    """What the worker stages for its exact sum, client by client, against the broadcast it started from."""
    staged = []
    stage = ClientSums.stage
    monkeypatch.setattr(ClientSums, "stage", lambda self, client, t: staged.append(
        (t.uploads[WEIGHTS].double().clone(), t.update_norm)) or stage(self, client, t))
    server = in_process_server(dp_config(tmp_path, dp))
    server.restore(None)
    for round_idx in (1, 2):
        started_from, staged[:] = torch.from_numpy(server.state[WEIGHTS].copy()).double(), []
        outcome = server.round(round_idx)
        assert len(staged) == len(outcome.sampled) == 4
        norms = [float((upload - started_from).norm()) for upload, _ in staged]
        if dp == "central":
            assert max(norms) <= CLIP + 1e-5 and outcome.privacy["clipped_fraction"] == 1.0  # every update was longer
        else:  # the client's own noise on top: z C per value
            assert all(n > CLIP for n in norms)
        assert all(float(norm) > CLIP for _, norm in staged)  # the norm before clipping travels with the report


@pytest.mark.parametrize("algorithm", ["fedper", "ditto"])
def test_personal_parts_are_neither_clipped_nor_noised(tmp_path, monkeypatch, algorithm):
    """The same client's round from the same broadcast, with local DP and without: its kept personal state is the
    same bit for bit; only the shared upload changes."""
    kept = {}
    for dp in ("local", None):
        cfg = dp_config(tmp_path, dp or "local", algorithm)
        if dp is None:
            cfg = cfg.model_copy(update={"privacy": None})
        server = in_process_server(cfg)
        server.restore(None)
        server.round(1)
        stores = [w.runtime.slots for w in server.pool.workers]
        kept[dp] = {(name, c): store[c].copy() for slots in stores for name, store in slots.items()
                    for c in server.plan.sampled(1) if c in store}
    assert kept["local"].keys() == kept[None].keys() and kept[None]
    assert all(np.array_equal(kept["local"][k], kept[None][k]) for k in kept[None])
