"""Every method on text: one round of the real server over in-process workers on three Hamlet characters with a
tiny character LSTM (issue 69 item 3)."""
import numpy as np
import pytest
from conftest import in_process_server, shakespeare_tree

from fedsim.algorithms import ALGORITHMS, WEIGHTS
from fedsim.config import validate

SETTINGS = {"fedfomo": {"models_to_download": 1}, "fedrep": {"head_epochs": 1}}  # 3 clients; quick


@pytest.mark.parametrize("method", sorted(ALGORITHMS))
def test_every_method_trains_and_scores_a_round_on_text(tmp_path, data_root, method):
    algorithm = {"name": method, **SETTINGS.get(method, {})}
    cfg = validate(shakespeare_tree(tmp_path, data_root, algorithm=algorithm, train__rounds=1,
                                    eval__finetune_epochs=1))
    server = in_process_server(cfg)
    server.restore(None)
    before = server.state[WEIGHTS].copy()
    result = server.round(1)
    assert np.all(np.isfinite(server.state[WEIGHTS]))
    shares_weights = before.size > 0 and method != "local"  # FedProto shares prototypes, Local nothing
    assert not shares_weights or not np.array_equal(server.state[WEIGHTS], before)
    records = result.records
    assert sorted(r["client"] for r in records) == [0, 1, 2]
    assert all(np.isfinite([r["perplexity"], r["perplexity_personalized"]]).all() and 0 <= r["acc_personalized"] <= 1
               for r in records)


@pytest.mark.parametrize("method", ["fedavg", "fedper"])
def test_text_runs_are_bit_identical_on_one_and_three_workers(tmp_path, data_root, method):
    finals = []
    for workers in (1, 3):
        cfg = validate(shakespeare_tree(tmp_path / str(workers), data_root, algorithm=method, engine__workers=workers))
        server = in_process_server(cfg)
        server.restore(None)
        records = [server.round(r).records for r in (1, 2)]
        finals.append((server.state[WEIGHTS].copy(), records))
    (one, scored_one), (three, scored_three) = finals
    assert np.array_equal(one, three) and scored_one == scored_three
