"""Each method's mechanism is at work at its defaults: a method that silently becomes another (FedAMP's attention
vanishing into local training, APFL's alpha stuck, IFCA's clusters collapsing into one model) fails here. Every
quantity is the one the method records per round (``Algorithm.mechanism`` in rounds.jsonl, ``ctx.record`` in the
records), read through the engine's own round row."""
import pytest
from conftest import in_process_server, set_dotted
from test_algorithms import started

from fedsim.algorithms import FEDAVG, LOCAL, MechanismState, mechanism_state
from fedsim.config import validate
from fedsim.metrics.logger import round_row

ROUNDS = 3


def _recorded(key: str):
    """A ctx.record value's mean across the clients trained in the last round."""
    return lambda rows: rows[-1][key]["mean"]


def _mechanism(key: str):
    """An Algorithm.mechanism value after the last round's server step."""
    return lambda rows: rows[-1]["mechanism"][key]


# method -> (what shows the mechanism at work, how it is read from the rounds' rows, the test, the setting's overrides)
MECHANISMS = {
    "fedamp": ("self-weight xi_ii below 0.95: the other clients' models enter u_i",
               _mechanism("fedamp_self_weight_mean"), lambda v: v < 0.95, {}),
    "ifca": ("more than one cluster chosen", _mechanism("ifca_clusters_used"), lambda v: v > 1, {}),
    "apfl": ("alpha moved from its start 0.5", _recorded("apfl_alpha"), lambda v: abs(v - 0.5) > 1e-3, {}),
    "ditto": ("personal model apart from the global one", _recorded("ditto_distance"), lambda v: v > 0, {}),
    "pfedme": ("personal model theta apart from w", _recorded("pfedme_distance"), lambda v: v > 0, {}),
    "fedala": ("W learned away from ones", _recorded("fedala_w_mean"), lambda v: v < 1, {}),
    # On clients of one distribution another's model can lower a client's held-out loss, so some weights are positive
    # (on the synthetic set's own, unlike, clients FedFomo rightly keeps each client's own model after round 2).
    "fedfomo": ("downloaded models enter the combination in some round",
                lambda rows: max(row["fedfomo_models_used"]["mean"] for row in rows), lambda v: v > 0,
                {"data__partition": "iid"}),
    "fedproto": ("representations pulled toward the global prototypes", _recorded("fedproto_prototype_mse"),
                 lambda v: v > 0, {}),
}


@pytest.mark.parametrize("method", sorted(MECHANISMS))
def test_the_mechanism_is_at_work_at_the_methods_defaults(tmp_path, monkeypatch, method):
    what, read, active, setting = MECHANISMS[method]
    server = started(monkeypatch, tmp_path, method, train__rounds=ROUNDS, train__fraction=1.0, train__eval_every=1,
                     **setting)
    rows = [round_row(server.round(r)) for r in range(1, ROUNDS + 1)]
    value = read(rows)
    assert active(value), f"{method}: {what}: not so after {ROUNDS} rounds ({value})"
    # ... and the state the leaderboard shows says so: a value, no "acts as" flag.
    state = mechanism_state(server.plan.cfg.algorithm.model_dump(), rows)
    assert state is not None and state.value and state.flag is None, state


@pytest.mark.slow
def test_fedamps_attention_is_at_work_on_the_leaderboards_pathological_setting(tmp_path, monkeypatch, data_root):
    """FedAMP at its defaults on `fedsim reproduce leaderboard --scale cpu`'s CIFAR-100 pathological setting (20
    clients, 10 classes each, cnn4): after 5 rounds a client's own model is not all of u_i (with sigma = 1,
    PFLlib's default, the mean self-weight was 0.99999: local training)."""
    from fedsim.reproduce import leaderboard

    tree = {key: value for key, value in leaderboard.base_file("cpu").items() if key != "tune"}
    for dotted, value in {**leaderboard.BOARD.settings["pathological"].overrides, "algorithm": "fedamp", "train.rounds": 5,
                          "train.eval_every": 5, "data.root": str(data_root), "out_dir": str(tmp_path)}.items():
        set_dotted(tree, dotted, value)
    server = in_process_server(validate(tree))
    server.restore(None)
    for r in range(1, 6):
        result = server.round(r)
    assert result.mechanism["fedamp_self_weight_mean"] < 0.95
    assert result.mechanism["fedamp_self_weight_min"] >= 0


def test_a_method_without_a_server_side_mechanism_records_none(tmp_path, monkeypatch):
    result = started(monkeypatch, tmp_path, "fedavg", train__rounds=1).round(1)
    assert result.mechanism == {} and "mechanism" not in round_row(result)


def _rows(mechanism: dict | None = None, **recorded: float) -> list[dict]:
    """Two rounds.jsonl rows: the first with other values, the second with these (the state reads the last)."""
    first = {"round": 1, "mechanism": {k: -1.0 for k in mechanism or {}}, **{k: {"mean": -1.0} for k in recorded}}
    last = {"round": 2, **({"mechanism": mechanism} if mechanism else {}),
            **{k: {"mean": v, "std": 0.0} for k, v in recorded.items()}}
    return [first, last]


@pytest.mark.parametrize("algorithm, rows, expected", [
    ("fedamp", _rows({"fedamp_self_weight_mean": 0.99999}), MechanismState("self-weight 1", LOCAL)),
    ("fedamp", _rows({"fedamp_self_weight_mean": 0.62}), MechanismState("self-weight 0.62")),
    ({"name": "ifca", "clusters": 4}, _rows({"ifca_clusters_used": 1.0}), MechanismState("1 of 4 clusters used", FEDAVG)),
    ("apfl", _rows(apfl_alpha=0.996), MechanismState("alpha 0.996", LOCAL)),
    ("apfl", _rows(apfl_alpha=0.004), MechanismState("alpha 0.004", FEDAVG)),
    ("apfl", _rows(apfl_alpha=0.5), MechanismState("alpha 0.5")),
    ({"name": "fedproto", "lambda": 0.0}, [], MechanismState("prototype term 0 (lambda 0)", LOCAL)),
    ("fedproto", _rows(fedproto_prototype_mse=1e-5), MechanismState("prototype term 1e-05", LOCAL)),
    ("ditto", _rows(ditto_distance=1e-5), MechanismState("||v - w|| 1e-05", FEDAVG)),
    ({"name": "ditto", "lambda": 0.0}, _rows(ditto_distance=3.0), MechanismState("||v - w|| 3", LOCAL)),
    ("pfedme", _rows(pfedme_distance=0.0), MechanismState("||theta - w|| 0", FEDAVG)),
    ("fedala", _rows(fedala_w_mean=1.0), MechanismState("W 1", FEDAVG)),
    ("fedfomo", _rows(fedfomo_models_used=0.0), MechanismState("0 models used", LOCAL)),
])
def test_a_switched_off_mechanism_is_flagged_from_the_runs_last_values(algorithm, rows, expected):
    assert mechanism_state(algorithm, rows) == expected


def test_a_method_without_a_mechanism_or_a_run_without_records_has_no_state():
    assert mechanism_state("fedavg", _rows(apfl_alpha=1.0)) is None
    assert mechanism_state("apfl", []) is None
