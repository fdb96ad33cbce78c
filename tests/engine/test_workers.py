"""Results do not depend on how many workers run them: every method, 1, 2 and 3 workers, bit for bit,
through the engine's own Server (in-process workers; tests/test_engine.py does the same over Ray)."""
import numpy as np
import pytest
from conftest import in_process_server, round_records, six_client_run

from fedsim.algorithms import ALGORITHMS

ROUNDS = 2
# the default 10 head epochs (FedRep) and 5 solver steps a batch (pFedMe) test nothing more here, slowly (pFedMe's
# were 3 of the suite's 30 minutes under load)
QUICK = {"fedrep": {"head_epochs": 2}, "pfedme": {"K": 2}}
# variants with state or scoring of their own (APFL's FedTorch variant: the client's w kept, the outputs mixed)
VARIANTS = {"apfl-fedtorch": {"name": "apfl", "variant": "fedtorch", "adaptive": True}}


def _setup(tmp_path, data_root, algorithm, workers, validation=0.0):
    method = VARIANTS.get(algorithm, {"name": algorithm, **QUICK.get(algorithm, {})})
    return six_client_run(tmp_path, data_root, method, workers, ROUNDS, validation=validation)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS) + sorted(VARIANTS))
def test_every_method_is_bit_identical_on_one_two_and_three_workers(tmp_path, data_root, monkeypatch, algorithm):
    results = {}
    for workers in (1, 2, 3):
        server = in_process_server(_setup(tmp_path, data_root, algorithm, workers))
        server.restore(None)
        results[workers] = (round_records([server.round(r) for r in range(1, ROUNDS + 1)]), server.state)
    (one, state1), (two, state2), (three, state3) = results.values()
    assert one == two == three
    assert all(np.array_equal(state1[k], s[k]) for s in (state2, state3) for k in state1)


@pytest.mark.parametrize("algorithm, validation", [
    *((name, 0.0) for name in ["scaffold", "fedavgm", "apfl", "apfl-fedtorch", "fedper", "pfedme", "fedrod",
                               "fedproto", "ifca", "fedfomo", "fedala", "fedamp"]), ("fedala", 0.3)])
def test_checkpointed_server_and_client_state_resume_exactly(tmp_path, data_root, monkeypatch, algorithm, validation):
    """Server slots (momentum, control variates) and client slots survive a checkpoint, also when the
    resumed run has another number of workers (and with data.validation's split)."""
    straight = in_process_server(_setup(tmp_path, data_root, algorithm, 2, validation))
    straight.restore(None)
    expected = round_records([straight.round(r) for r in range(1, ROUNDS + 1)])

    first = in_process_server(_setup(tmp_path, data_root, algorithm, 2, validation))
    first.restore(None)
    head = round_records([first.round(1)])
    ckpt = first.checkpoint(str(tmp_path / "run"), 1)
    resumed = in_process_server(_setup(tmp_path, data_root, algorithm, 3, validation))
    assert resumed.restore(ckpt) == 1
    assert head + round_records([resumed.round(2)]) == expected


def test_an_evaluation_cohort_is_fixed_by_the_seed_and_everyone_is_scored_at_the_end(tmp_path, data_root,
                                                                                      monkeypatch):
    from fedsim.plan import evaluation_cohort

    cohort = evaluation_cohort(4, 6, 3)
    assert cohort == evaluation_cohort(4, 6, 0.5) and len(cohort) == 3 and cohort != evaluation_cohort(5, 6, 3)
    assert evaluation_cohort(4, 6, None) == evaluation_cohort(4, 6, 1.0) == list(range(6))
    rounds = {}
    for workers in (1, 3):
        cfg = _setup(tmp_path, data_root, "fedper", workers)
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"eval_every": 1}),
                                     "eval": cfg.eval.model_copy(update={"clients": 3})})
        server = in_process_server(cfg)
        server.restore(None)
        rounds[workers] = round_records([server.round(r) for r in range(1, ROUNDS + 1)])
    assert rounds[1] == rounds[3]
    first, last = rounds[1][0][2], rounds[1][-1][2]
    assert [r["client"] for r in first] == cohort and [r["client"] for r in last] == list(range(6))


