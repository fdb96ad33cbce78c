"""Secure aggregation through the engine (privacy.secure_aggregation, fedsim/privacy/secagg.py): the server receives
only masked partials, and a run with it is bit for bit the run without it, on any number of workers, after a
resume, and when clients of the cohort do not deliver (a diverged client, dropouts and late reports on the virtual
clock)."""
import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import in_process_server, read_jsonl, round_records, synthetic_tree

import fedsim.engine.reduction as reduction_module
from fedsim.client.runtime import ClientRuntime
from fedsim.config import validate
from fedsim.core.aggregate import RoundSums
from fedsim.core.protocol import WEIGHTS
from fedsim.engine.runfolder_checks import load_run_config
from fedsim.simulate import run

ROUNDS = 2
SECURE = {"dp": "none", "secure_aggregation": True}


def _config(tmp_path, name: str, workers: int, secure: bool, **over):
    """8 synthetic clients, 4 a round (FedAvg: each round split afresh over the workers), scored every round."""
    settings = {"algorithm": "fedavg", "engine__workers": workers, "train__rounds": ROUNDS, "train__eval_every": 1}
    tree = synthetic_tree(tmp_path, name, **{**settings, **over})
    if secure:
        tree["privacy"] = SECURE
    return validate(tree)


def _rounds(monkeypatch, cfg, ckpt=None, first=1):
    server = in_process_server(cfg)
    server.restore(ckpt)
    return server, [server.round(r) for r in range(first, ROUNDS + 1)]


def _same(server_a, outcomes_a, server_b, outcomes_b) -> None:
    assert round_records(outcomes_a) == round_records(outcomes_b)
    assert all(np.array_equal(server_a.state[k], server_b.state[k]) for k in server_a.state)


ASYNC = {"devices": {"preset": "lognormal", "sigma": 1.0}, "mode": "async", "async_buffer": 2}


@pytest.mark.parametrize("over", [{}, {"algorithm": "fedper", "engine__pack": 2}, {"system": ASYNC}],
                         ids=["fedavg", "fedper-packed", "fedbuff"])
def test_results_are_the_plain_runs_on_one_two_and_three_workers(tmp_path, monkeypatch, over):
    plain = _rounds(monkeypatch, _config(tmp_path, "plain", 2, False, **over))
    for workers in (1, 2, 3):
        _same(*plain, *_rounds(monkeypatch, _config(tmp_path, f"s{workers}", workers, True, **over)))


def test_results_are_the_plain_runs_after_a_resume(tmp_path, monkeypatch):
    plain = _rounds(monkeypatch, _config(tmp_path, "plain", 2, False))
    first = in_process_server(_config(tmp_path, "b", 2, True))
    first.restore(None)
    head = [first.round(1)]
    ckpt = first.checkpoint(str(tmp_path / "run"), 1)
    resumed, tail = _rounds(monkeypatch, _config(tmp_path, "b", 3, True), ckpt, first=2)
    _same(*plain, resumed, head + tail)


def test_the_server_receives_only_masked_partials_and_their_sum_is_exact(tmp_path, monkeypatch):
    # One client per worker (engine.workers = the cohort's size): a partial is a single client's upload.
    received: dict[bool, list[np.ndarray]] = {}
    servers = {}
    for secure in (False, True):
        seen = received.setdefault(secure, [])

        class Recording(RoundSums):
            def add(self, sums, weights, seen=seen):
                seen.append(sums[WEIGHTS].copy())
                super().add(sums, weights)

        monkeypatch.setattr(reduction_module, "RoundSums", Recording)
        servers[secure] = _rounds(monkeypatch, _config(tmp_path, f"w{secure}", 4, secure))
    plain, masked = received[False], received[True]
    assert len(masked) == len(plain) == 4 * ROUNDS  # 4 clients a round on 4 workers: one client per partial
    _same(*servers[False], *servers[True])  # the masks cancel in the server's sum, bit for bit
    for upload, what_arrived in zip(plain, masked):
        assert np.mean(upload == what_arrived) < 1e-3
    words = np.concatenate(masked[:4]).view(np.uint64)  # round 1's partials
    assert words.size >= 10 ** 4
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all((bits.mean(axis=0) > 0.45) & (bits.mean(axis=0) < 0.55))
    plain_bits = (np.concatenate(plain[:4]).view(np.uint64)[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert not np.all((plain_bits.mean(axis=0) > 0.45) & (plain_bits.mean(axis=0) < 0.55))  # the check can fail


def test_a_diverged_clients_masks_are_removed(tmp_path, monkeypatch):
    # Client 3 of round 1's cohort [0, 1, 3, 7] diverges and is dropped (train.on_nonfinite: drop): the survivors'
    # masks with it stay in the sum until the server removes them.
    update = ClientRuntime._client_update

    def diverging(self, port, client, round_idx, *args):
        trained = update(self, port, client, round_idx, *args)
        if (client, round_idx) != (3, 1):
            return trained
        return dataclasses.replace(trained, loss=torch.tensor(float("nan")))

    monkeypatch.setattr(ClientRuntime, "_client_update", diverging)
    plain = _rounds(monkeypatch, _config(tmp_path, "plain", 2, False, train__on_nonfinite="drop"))
    secure = _rounds(monkeypatch, _config(tmp_path, "secure", 2, True, train__on_nonfinite="drop"))
    assert plain[1][0].sampled == [0, 1, 3, 7] and [o.dropped for o in secure[1]] == [[3], []]
    _same(*plain, *secure)


def test_dropouts_and_late_reports_on_the_virtual_clock(tmp_path, monkeypatch):
    # The cohort is everyone selected; those that drop out or report after the deadline never deliver.
    system = {"devices": {"preset": "lognormal", "sigma": 1.0}, "dropout": 0.3, "over_selection": 0.5,
              "deadline_s": 2.0}
    plain = _rounds(monkeypatch, _config(tmp_path, "plain", 2, False, system=system))
    secure = _rounds(monkeypatch, _config(tmp_path, "secure", 3, True, system=system))
    assert any(o.timing["dropouts"] or o.timing["late"] for o in secure[1])  # the clock did bite
    masks = secure[0].plan.pairwise_masks(1)
    assert masks is not None and len(masks.cohort) == secure[1][0].timing["selected"]
    _same(*plain, *secure)


def _files(run_dir):
    """What a run wrote that must not change: per-client metrics, the rounds without wall-clock time, the model."""
    rounds = [{k: v for k, v in r.items() if "seconds" not in k} for r in read_jsonl(run_dir / "rounds.jsonl")]
    model = np.load(run_dir / "model.npz")
    return (run_dir / "metrics.jsonl").read_text(), json.dumps(rounds), {k: model[k].tobytes() for k in model}


def test_over_ray_the_run_folder_is_the_plain_runs_also_after_a_resume(tmp_path, local_ray):
    plain = run(_config(tmp_path, "plain", 1, False))  # one worker: the reference; two below, over real actors
    secure = run(_config(tmp_path, "secure", 2, True, train__rounds=1))
    run(load_run_config(secure.run_dir, [f"train.rounds={ROUNDS}"]), resume=True)
    assert _files(secure.run_dir) == _files(plain.run_dir)
