"""A sweep's ledger (``fedsim/sweep/ledger.py``): what the progress callback records for a trial the scheduler
stopped is read back as this sweep's when the same sweep runs again (tests/hostile/test_ledgers.py holds the
hostile ledgers)."""
from types import SimpleNamespace

from conftest import synthetic_tree

from fedsim.config import validate
from fedsim.sweep.executor import Sweep, _progress
from fedsim.sweep.expand import expand_sweep
from fedsim.sweep.trial import TrialRun


def test_a_stop_a_sweep_records_counts_when_the_same_sweep_runs_again(tmp_path):
    """The ledger's round trip: what the progress callback writes for a stopped trial is read back as this sweep's."""
    tree = synthetic_tree(tmp_path, "led", sweep={"algorithm": ["fedavg", "fedper"]},
                          search={"scheduler": "asha", "metric": "fairness/acc_mean"})
    configs = expand_sweep(tree)
    sweep = Sweep("led", configs, validate(tree).search)
    runs = {cfg.name: TrialRun(cfg, "run", str(tmp_path)) for cfg in sweep.configs}
    progress = _progress(sweep, runs, {}, None, lambda line: None, {})
    trial = SimpleNamespace(config={"run": configs[1].name}, last_result={"round": 2, "fairness/acc_mean": 0.3})
    progress.on_trial_complete(0, [], trial)
    said: list[str] = []
    again = Sweep("led", expand_sweep(tree), sweep.search)
    assert again.stopped_runs(said.append) == {configs[1].name: {"round": 2, "config": sweep.fingerprints[configs[1].name],
                                                                 "fairness/acc_mean": 0.3}} and not said
