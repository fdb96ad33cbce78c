"""User-level DP through the engine's own Server (in-process workers): a noisy run is the same bit for bit on 1, 2
and 3 workers, packed or not, and after a resume from a checkpoint (the noise is the server's or each client's own
stream, the adaptive clip norm checkpointed server state)."""
import numpy as np
import pytest
from conftest import in_process_server, round_records, synthetic_tree

from fedsim.config import validate
from fedsim.core.protocol import WEIGHTS
from fedsim.privacy.secagg import PairwiseMasks

ROUNDS = 2
MECHANISMS = {"central": {"dp": "central"}, "local": {"dp": "local"},
              "adaptive": {"dp": "central", "adaptive": {"target_quantile": 0.5, "lr": 0.5, "count_noise": 1.0}}}


def dp_config(tmp_path, mechanism: str, workers: int, pack=1, noise=1.0):
    tree = synthetic_tree(tmp_path, **{"algorithm": "fedper", "engine.workers": workers, "engine.pack": pack,
                                       "train.weighting": "uniform", "train.rounds": ROUNDS, "train.eval_every": 1})
    tree["privacy"] = {**MECHANISMS[mechanism], "noise_multiplier": noise, "clip_norm": 0.2}
    return validate(tree)


def rounds(monkeypatch, cfg, first=1):
    server = in_process_server(cfg)
    server.restore(None)
    outcomes = [server.round(r) for r in range(first, ROUNDS + 1)]
    return round_records(outcomes), [o.privacy for o in outcomes], server.state


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("pack", [1, 2])
def test_a_dp_run_is_bit_identical_on_one_two_and_three_workers(tmp_path, monkeypatch, mechanism, pack):
    (one, privacy, state), *others = [rounds(monkeypatch, dp_config(tmp_path, mechanism, workers, pack))
                                      for workers in (1, 2, 3)]
    assert all(records == one and p == privacy for records, p, _ in others)
    assert all(np.array_equal(state[k], s[k]) for _, _, s in others for k in state)
    assert privacy[0]["noise_std"] > 0 and len(privacy) == ROUNDS
    if mechanism == "adaptive":
        assert privacy[1]["clip_norm"] != privacy[0]["clip_norm"]  # the clip norm moved, and both runs moved it alike
    quiet = rounds(monkeypatch, dp_config(tmp_path, mechanism, 2, pack, noise=0.0))
    assert not np.array_equal(quiet[2][WEIGHTS], state[WEIGHTS])  # the noise is there


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_a_resumed_dp_run_equals_an_undisturbed_one(tmp_path, monkeypatch, mechanism):
    expected, privacy, state = rounds(monkeypatch, dp_config(tmp_path, mechanism, 2))
    first = in_process_server(dp_config(tmp_path, mechanism, 2))
    first.restore(None)
    head = first.round(1)
    ckpt = first.checkpoint(str(tmp_path / "run"), 1)
    resumed = in_process_server(dp_config(tmp_path, mechanism, 3))
    assert resumed.restore(ckpt) == 1
    tail = resumed.round(2)
    assert round_records([head, tail]) == expected and [head.privacy, tail.privacy] == privacy
    assert all(np.array_equal(resumed.state[k], state[k]) for k in state)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_secure_aggregation_leaves_a_dp_run_bit_identical(tmp_path, monkeypatch, mechanism):
    """Clipping (and local noise) come before the masks, central noise after they cancel: masking changes nothing."""
    plain, privacy, state = rounds(monkeypatch, dp_config(tmp_path, mechanism, 3))
    masked_cfg = dp_config(tmp_path, mechanism, 3)
    masked_cfg.privacy.secure_aggregation = True
    masked_uploads = []
    mask = PairwiseMasks.mask
    monkeypatch.setattr(PairwiseMasks, "mask", lambda self, *a, **k: masked_uploads.append(1) or mask(self, *a, **k))
    masked, masked_privacy, masked_state = rounds(monkeypatch, masked_cfg)
    assert masked_uploads  # the uploads were masked
    assert masked == plain and masked_privacy == privacy
    assert all(np.array_equal(masked_state[k], state[k]) for k in state)


def test_under_dp_batchnorm_statistics_stay_on_each_client_and_out_of_the_clipped_update(tmp_path, data_root,
                                                                                           monkeypatch):
    """cnn4 under central DP: the method would average BatchNorm's running statistics, so DP keeps them on each
    client (local_statistics): the clipped, noised upload is the weights alone (its norm is theirs), the server's
    noise never reaches a variance, and every client's kept running variance stays non-negative."""
    from conftest import plan_for, small_config

    cfg = small_config(tmp_path, data_root, algorithm="fedavg", train__weighting="uniform", train__rounds=2,
                       privacy={"dp": "central", "noise_multiplier": 3.0, "clip_norm": 0.05})
    plan = plan_for(cfg)
    statistics = plan.model.keys.statistics
    assert plan.algorithm.bn_mode == "local_statistics" and statistics  # cnn4 has BatchNorm with running statistics
    assert statistics <= plan.model.buffers and not statistics & set(plan.model.layouts["shared"].keys)
    assert {k for k in plan.model.layouts["personal"].keys} == statistics
    server = in_process_server(cfg)
    server.restore(None)
    outcomes = [server.round(r) for r in (1, 2)]
    assert all(o.privacy["clipped_fraction"] == 1.0 for o in outcomes)  # the weights' own update is clipped
    personal = plan.model.layouts["personal"]
    variances = [values for worker in server.pool.workers for client in worker.runtime.client_data
                 if (kept := worker.runtime.stored("personal", client)) is not None
                 for key, values in personal.arrays(kept).items() if key.endswith("running_var")]
    assert variances and all((v >= 0).all() for v in variances)
