"""fedsim/plan/privacy.py and RunPlan's privacy: the accountant's view of a run, z calibrated once on the driver
and shipped, epsilon per round looked up without dp-accounting, the budget refusal and the summary."""
import pickle
import subprocess
import sys

import pytest
from conftest import accounting_of, plan_for, synthetic_tree

from fedsim.config import validate
from fedsim.errors import ConfigError
from fedsim.plan.privacy import describe_privacy, refuse_over_budget, spent_per_round
from fedsim.privacy import EPSILON, EPSILON_MEDIAN

POISSON = {"algorithm": "fedavg", "train.sampling": "poisson", "train.fraction": 0.25, "train.weighting": "uniform"}


def dp_tree(tmp_path, privacy: dict, **over):
    return {**synthetic_tree(tmp_path, **{**POISSON, **over}), "privacy": privacy}


def test_target_epsilon_calibrates_z_once_and_the_workers_plan_carries_it(tmp_path):
    plan = plan_for(validate(dp_tree(tmp_path, {"target_epsilon": 4.0})))
    z = plan.privacy.mechanism.noise_multiplier
    rounds = plan.cfg.train.rounds
    assert accounting_of(plan).epsilon(z, rounds) <= 4.0 < accounting_of(plan).epsilon(0.99 * z, rounds)
    assert plan.for_workers().user_level_dp.noise_multiplier == z  # a worker's plan has no clients to calibrate over
    summary = plan.privacy.summary
    assert summary["calibrated"] and summary["noise_multiplier"] == z and summary["q"] == 0.25
    assert summary["epsilon"] == plan.privacy_at(rounds)[EPSILON] <= 4.0
    assert [plan.privacy_at(r)[EPSILON] for r in range(1, rounds + 1)] == sorted(
        plan.privacy_at(r)[EPSILON] for r in range(1, rounds + 1))
    assert "calibrated to epsilon 4" in describe_privacy(summary)


def test_the_fixed_samplers_cohort_and_the_pool_without_held_out_clients_are_what_is_accounted(tmp_path):
    plan = plan_for(validate(dp_tree(tmp_path, {"noise_multiplier": 1.0}, **{"train.sampling": "fixed",
                                                                              "train.fraction": 0.5,
                                                                              "eval.unseen": 2})))
    acc = accounting_of(plan)
    assert acc.population == 6 and acc.cohort == len(plan.sampled(1)) == 3 and acc.sampling_rate == 0.5
    assert acc.delta == 1e-5  # min(1e-5, 1/N^2) for the 6 that may train


def test_without_dp_nothing_is_accounted(tmp_path):
    plan = plan_for(validate(synthetic_tree(tmp_path)))
    assert accounting_of(plan) is None and plan.privacy is None and plan.privacy_at(1) == {}


def test_the_server_looks_epsilon_up_without_importing_dp_accounting(tmp_path):
    plan = plan_for(validate(dp_tree(tmp_path, {"noise_multiplier": 1.0})))
    assert plan.privacy.spent  # computed on the driver, as preflight does before the plan is shipped
    path = tmp_path / "plan.pkl"
    path.write_bytes(pickle.dumps(plan))
    code = (f"import pickle, sys; import fedsim.engine.server; plan = pickle.loads(open({str(path)!r}, 'rb').read()); "
            f"print(plan.privacy_at(2)[{EPSILON!r}]); assert 'dp_accounting' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) == plan.privacy_at(2)[EPSILON]


def test_local_dp_reports_the_most_frequent_and_the_median_clients_epsilon(tmp_path):
    cfg = validate(dp_tree(tmp_path, {"dp": "local", "noise_multiplier": 2.0}, **{"train.rounds": 3}))
    from fedsim.privacy.accountant import Accounting

    acc = Accounting("local", "poisson", 4, 1, 0.25, 1e-3, "rdp")
    drawn = {1: [0], 2: [0, 1], 3: [0, 1, 2]}
    spent = spent_per_round(cfg, acc, 2.0, drawn.__getitem__, 5, pool=[0, 1, 2, 3])  # client 4: held out
    one, two, three = (acc.client_epsilon(2.0, k) for k in (1, 2, 3))
    assert spent[0] == {EPSILON: one, EPSILON_MEDIAN: 0.0}  # counts 1, 0, 0, 0
    assert spent[1] == {EPSILON: two, EPSILON_MEDIAN: pytest.approx(one / 2)}  # 2, 1, 0, 0
    assert spent[2] == {EPSILON: three, EPSILON_MEDIAN: pytest.approx((one + two) / 2)}  # 3, 2, 1, 0


def test_a_run_that_would_pass_its_budget_is_refused_naming_the_round(tmp_path):
    cfg = validate(dp_tree(tmp_path, {"noise_multiplier": 1.0, "target_epsilon": 0.5}))
    spent = ({EPSILON: 0.2}, {EPSILON: 0.4}, {EPSILON: 0.6}, {EPSILON: 0.8})
    with pytest.raises(ConfigError) as err:
        refuse_over_budget(cfg, spent)
    assert str(err.value) == ("privacy.target_epsilon: epsilon would pass 0.5 at round 3 of 4 (noise multiplier 1, "
                              "rdp, poisson sampling); raise privacy.noise_multiplier, set train.rounds to at most 2, "
                              "or leave privacy.noise_multiplier out to calibrate it")
    refuse_over_budget(cfg, spent[:2])  # within the budget: starts
    refuse_over_budget(validate(dp_tree(tmp_path, {"noise_multiplier": 1.0})), spent)  # no budget given
