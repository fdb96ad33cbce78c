"""`fedsim sweep`: a config's variants as Ray Tune trials on a local Ray - at once, each equal to the same variant
run alone, a failing trial named with its cause while the others go on, resumable after the sweep's process is
killed (finished trials never retrained), ASHA's stops remembered, bad input refused before any trial."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli_env, fedsim_cli, lightning_tree, read_jsonl, synthetic_tree, write_yaml
from fedsim.cli.main import main
from fedsim.config import validate
from fedsim.metrics.wandb_files import record as wandb_record
from fedsim.sweep.expand import expand_sweep
from fedsim.sweep.runs import claimed


def _lines(proc: subprocess.CompletedProcess | str, suffix: str) -> list[str]:
    text = proc if isinstance(proc, str) else proc.stdout
    return [line for line in text.splitlines() if line.endswith(suffix) or f": {suffix}" in line]


@pytest.mark.slow
def test_two_variants_run_at_once_each_equals_its_run_alone_and_a_failing_one_is_named(tmp_path):
    tree = lightning_tree(tmp_path, "TwoPartModule", sweep={"model.client": ["user_plugins:TwoPartModule",
                                                                             "user_plugins:Broken"]},
                          **{"logging.wandb.mode": "offline"})
    config = write_yaml(tmp_path / "lm.yaml", tree)
    good, broken = (cfg.name for cfg in expand_sweep(tree))
    proc = fedsim_cli("sweep", str(config), "--max-concurrent", "2", env=cli_env(WANDB_MODE="offline"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    events = [line for line in proc.stdout.splitlines() if line.startswith(("lm-", f"{good}:", f"{broken}:"))
              and not line.startswith("| ")]
    starts = [i for i, line in enumerate(events) if line.endswith(": running")]
    ends = [i for i, line in enumerate(events) if ": finished" in line or ": failed" in line]
    assert len(starts) == 2 and max(starts) < min(ends), events  # both trials were running before either ended
    [failed] = [line for line in events if ": failed" in line]
    assert failed.startswith(f"{broken}: failed: ") and "Broken.training_step raised ValueError: boom" in failed
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fedsim: error:")]
    assert len(errors) == 1 and "1 of 2 trials failed" in errors[0] and broken in errors[0]
    table = (tmp_path / "_sweeps" / "lm" / "results.md").read_text()
    assert f"| {good} | finished |" in table and f"| {broken} | failed: " in table

    # W&B: the variant's own group (no method averaged with another) and the sweep's tag.
    [offline] = (tmp_path / good / "wandb").glob("offline-run-*")
    run_record = wandb_record(offline, "run")
    assert run_record.run_group == good and any(tag.startswith("sweep:lm-") for tag in run_record.tags)

    alone = fedsim_cli("run", str(config), "sweep.model.client=[user_plugins:TwoPartModule]", "--quiet",
                       "logging.wandb.mode=disabled", f"out_dir={tmp_path / 'alone'}")
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert read_jsonl(tmp_path / "alone" / good / "metrics.jsonl") == read_jsonl(tmp_path / good / "metrics.jsonl")


def _appeared(path, proc, timeout: float = 300) -> bool:
    """Whether `path` appears while `proc` still runs (the caller reads its output either way)."""
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.slow
def test_a_killed_sweep_rerun_replays_finished_trials_resumes_the_rest_and_keeps_ashas_stops(tmp_path):
    tree = synthetic_tree(tmp_path, "ks", **{"train.eval_every": 1, "engine.checkpoint_every": 1, "engine.workers": 1},
                          sweep={"algorithm": ["fedavg", "fedper", "fedprox"]},
                          search={"scheduler": "asha", "metric": "fairness/acc_mean", "grace_rounds": 2,
                                  "reduction_factor": 2})
    config = write_yaml(tmp_path / "ks.yaml", tree)
    fedavg, fedper, fedprox = (tmp_path / cfg.name for cfg in expand_sweep(tree))
    command = [sys.executable, "-m", "fedsim.cli.main", "sweep", str(config), "--max-concurrent", "1"]
    proc = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        appeared = _appeared(fedper / "checkpoints" / "latest", proc)  # one trial at a time: fedavg is done by then
    finally:
        with contextlib.suppress(ProcessLookupError):  # a sweep that died early: its own output says why
            os.killpg(proc.pid, signal.SIGKILL)  # the sweep's process and its local Ray
        first_output = proc.communicate()[0]
    assert appeared, f"fedper's checkpoint never appeared:\n{first_output[-4000:]}"
    assert (fedavg / "summary.json").exists(), first_output[-4000:]
    finished_at = json.loads((fedavg / "summary.json").read_text())["finished_at"]
    assert not (fedper / "summary.json").exists()

    rerun = fedsim_cli("sweep", str(config), "--max-concurrent", "1")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert f"{fedavg.name}: done before, replaying its rounds" in rerun.stdout
    assert json.loads((fedavg / "summary.json").read_text())["finished_at"] == finished_at  # never retrained
    assert f"{fedper.name}: resuming from its checkpoint" in rerun.stdout, first_output[-2000:]
    assert [r["round"] for r in read_jsonl(fedper / "rounds.jsonl")] == [1, 2, 3, 4]
    # fedprox trails the two before it at ASHA's milestone (round 2) and is stopped there; the sweep remembers it.
    stopped = json.loads((tmp_path / "_sweeps" / "ks" / "sweep.json").read_text())["stopped"]
    assert list(stopped) == [fedprox.name] and stopped[fedprox.name]["round"] == 2
    assert f"| {fedprox.name} | stopped at round 2 |" in rerun.stdout
    assert not (fedprox / "summary.json").exists()


def test_a_run_asha_stopped_stays_stopped_a_finished_one_is_replayed_and_a_claimed_one_skipped(tmp_path):
    from contextlib import ExitStack

    from fedsim.sweep.executor import _actions

    configs = expand_sweep(synthetic_tree(tmp_path, "st", sweep={"algorithm": ["fedavg", "fedper", "fedprox"]}))
    for cfg, files in zip(configs, (["config.yaml", "summary.json"], ["config.yaml"], ["config.yaml"])):
        write_yaml(tmp_path / cfg.name / "config.yaml", cfg.model_dump())
        if "summary.json" in files:  # finished: its summary records the config's rounds
            (tmp_path / cfg.name / "summary.json").write_text(json.dumps({"rounds": cfg.train.rounds}))
    with ExitStack() as stack:
        runs, skipped = _actions(configs, {configs[1].name: {"round": 2}}, stack, print)
    assert [runs[c.name].action for c in configs] == ["replay", "replay", "resume"] and not skipped
    with ExitStack() as stack:  # --overwrite: every run trained anew, the finished and the stopped one too
        runs, _ = _actions(configs, {configs[1].name: {"round": 2}}, stack, print, overwrite=True)
    assert [runs[c.name].action for c in configs] == ["overwrite"] * 3
    with claimed(configs[2]):  # this process stands in for another sweep (or reproduce) training that run
        with ExitStack() as stack:
            runs, skipped = _actions(configs, {}, stack, print)
    assert list(runs) == [configs[0].name, configs[1].name] and runs[configs[1].name].action == "resume"
    assert [(o.name, o.state) for o in skipped] == [(configs[2].name, "skipped")]


@pytest.mark.parametrize("over, message", [
    ({"sweep": {"train.lrr": [0.1]}}, "sweep: train.lrr: Extra inputs are not permitted"),
    ({"sweep": {"algorithm": []}}, "sweep.algorithm: an empty list gives no runs"),
    ({"sweep": {"seed": [1, 2]}, "search": {"samples": 3}}, "search.samples: 3 samples of a sweep without distributions"),
    ({"sweep": {"seed": [1]}, "search": {"scheduler": "asha", "metric": "fairness/acc_personalized_p10"},
      "eval": {"finetune_epochs": 0}}, "search.metric: t-1 never reports 'fairness/acc_personalized_p10'"),
    ({"sweep": {"seed": [1]}, "search": {"scheduler": "asha", "metric": "fairness/acc_p10"}, "data.validation": 0.2},
     "search.metric: fairness/acc_p10 is scored on the test set, and ASHA would select on it; t-1 has data.validation: "
     "compare fairness/validation_acc_p10"),
    # docs/sweeps.md's own example, a module's value: under data.validation its validation_step's is validation_NAME
    ({"sweep": {"seed": [1]}, "search": {"scheduler": "asha", "metric": "val_loss/mean"}, "data.validation": 0.2},
     "search.metric: val_loss/mean is not computed on the validation split (values logged there are named "
     "validation_NAME; others come from test or training), and ASHA would select on it; t-1 has data.validation: "
     "compare fairness/validation_acc_mean or a value your module's validation_step logs, as "
     "validation_NAME/STATISTIC"),
    # a method's record scored on test (FedProto's prototype accuracy)
    ({"sweep": {"seed": [1]}, "algorithm": "fedproto", "data.validation": 0.2,
      "search": {"scheduler": "asha", "metric": "fedproto_acc_prototypes/mean"}},
     "search.metric: fedproto_acc_prototypes/mean is not computed on the validation split"),
])
def test_bad_sweeps_are_one_line_exit_2_before_any_trial(tmp_path, capsys, over, message):
    tree = synthetic_tree(tmp_path, **over)
    assert main(["sweep", str(write_yaml(tmp_path / "bad.yaml", tree))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "_sweeps").exists()


def test_max_concurrent_beyond_the_clusters_gpus_is_refused_before_any_trial(tmp_path, no_ray):
    import ray

    from fedsim.errors import ConfigError
    from fedsim.sweep.executor import Sweep, run_sweep

    configs = expand_sweep(synthetic_tree(tmp_path, "g", **{"engine.gpus_per_worker": 0.5}, sweep={"seed": [1, 2]}))
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="warning")
    try:
        with pytest.raises(ConfigError, match=r"--max-concurrent: 2 trials at once need 2 GPU, the Ray cluster has 1; "
                                              r"use --max-concurrent 1$"):
            run_sweep(Sweep("g", configs, configs[0].search), max_concurrent=2)
    finally:
        ray.shutdown()
    assert not any((tmp_path / cfg.name).exists() for cfg in configs)


def test_random_search_draws_from_the_seed_and_pairs_the_grid():
    tree = {"name": "r", "seed": 5, "sweep": {"algorithm": ["fedavg", "fedper"],
                                              "train.body.lr": {"loguniform": [1e-3, 1e-1]}},
            "search": {"samples": 3}}
    first, again = expand_sweep(tree), expand_sweep(tree)
    assert [c.name for c in first] == [c.name for c in again] and len(first) == 6
    lrs = [c.train.body.lr for c in first]
    assert lrs[0::2] == lrs[1::2] and len(set(lrs)) == 3 and all(1e-3 <= lr <= 1e-1 for lr in lrs)
    assert first[0].name == f"r-fedavg-{lrs[0]}" and first[0].logging.wandb.group == f"r-fedavg-{lrs[0]}"
    assert [c.train.body.lr for c in expand_sweep({**tree, "seed": 6})] != lrs


def test_the_progress_callback_pickles_after_ray_swaps_builtins_print(tmp_path, monkeypatch):
    """Ray replaces builtins.print once any worker logs to the driver; Tune then pickles its callbacks, and a
    callback holding the original `print` failed there (CI saw `fedsim sweep` die before its first trial)."""
    import builtins

    from ray import cloudpickle

    from fedsim.sweep.executor import Sweep, _progress

    configs = expand_sweep(synthetic_tree(tmp_path, "pk", sweep={"algorithm": ["fedavg"]}))
    progress = _progress(Sweep("pk", configs, configs[0].search), {}, {}, print, print, {})
    monkeypatch.setattr(builtins, "print", lambda *args, **kwargs: None)
    unpickled = cloudpickle.loads(cloudpickle.dumps(progress))
    assert unpickled.say is None and unpickled.say_start is None


def test_a_modules_own_logged_value_can_drive_asha_lower_is_better_for_a_loss(tmp_path):
    from fedsim.metrics.series import round_metrics
    from fedsim.sweep.executor import Sweep, _scheduler

    search = {"scheduler": "asha", "metric": "my_loss/mean"}  # TwoPartModule's self.log("my_loss", ...)
    tree = lightning_tree(tmp_path, "TwoPartModule", sweep={"seed": [1, 2]}, search=search)
    configs, base = expand_sweep(tree), validate(tree)
    sweep = Sweep("lg", configs, base.search)
    sweep.check()  # known only once the module runs: not refused
    from fedsim.sweep.trial import TrialRun

    asha = _scheduler(sweep, {cfg.name: TrialRun(cfg, "run", str(tmp_path)) for cfg in configs})
    assert sweep.mode == "min" and (asha._metric, asha._mode) == ("my_loss/mean", "min")
    # what each trial reports to Tune holds it, under that name
    row = {"round": 2, "seconds": 1.0, "bytes_up": 0, "bytes_down": 0, "acc": {"mean": 0.5},
           "my_loss": {"mean": 0.7, "p10": 0.9}}
    assert round_metrics(row)["my_loss/mean"] == 0.7
    from fedsim.errors import ConfigError

    with pytest.raises(ConfigError, match="never reports 'fairness/acc_bogus'"):
        Sweep("lg", configs, base.search.model_copy(update={"metric": "fairness/acc_bogus"})).check()


def test_ashas_stop_line_shows_the_metric_to_four_digits(tmp_path):
    from types import SimpleNamespace

    from fedsim.sweep.executor import Sweep, _progress

    tree = synthetic_tree(tmp_path, "sl", sweep={"seed": [1]}, search={"scheduler": "asha", "metric": "fairness/acc_p10"})
    configs = expand_sweep(tree)
    said: list[str] = []
    progress = _progress(Sweep("sl", configs, validate(tree).search), {}, {}, said.append, said.append, {})
    trial = SimpleNamespace(config={"run": configs[0].name}, last_result={"round": 3, "fairness/acc_p10": 61.8523456789})
    progress.on_trial_complete(0, [], trial)
    assert said == [f"{configs[0].name}: stopped by ASHA at round 3 (fairness/acc_p10 61.85)"]


@pytest.mark.slow
def test_a_relative_out_dir_and_data_path_resolve_from_where_the_sweep_ran(tmp_path):
    """Issue 46 item 1: each Tune trial runs in a working directory of Tune's; the run folders, the sweep's table
    and every other relative path of the config (here a device trace) are the user's, from where they ran fedsim."""
    trace = "traces/devices.csv"
    (tmp_path / "traces").mkdir()
    (tmp_path / trace).write_text("client,speed,up_mbps,down_mbps\n" + "".join(f"{c},100,5,20\n" for c in range(8)))
    tree = synthetic_tree(tmp_path, "rel", out_dir="runs", sweep={"seed": [1]},
                          **{"train.rounds": 1, "train.eval_every": 1, "engine.workers": 1,
                             "system.devices.trace": trace})
    write_yaml(tmp_path / "rel.yaml", tree)
    [cfg] = expand_sweep(tree)
    proc = fedsim_cli("sweep", "rel.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "runs" / cfg.name / "summary.json").exists()
    [row] = [line for line in proc.stdout.splitlines() if line.startswith(f"| {cfg.name} |")]
    assert f"| {cfg.name} | finished | -" not in row and row.split("|")[3].strip() != "-", row
    assert f"| {cfg.name} | finished |" in (tmp_path / "runs" / "_sweeps" / "rel" / "results.md").read_text()
    # Tune's own console output stays quiet: no configuration box, no TensorBoard hint (issue 67 item 6).
    assert "Configuration for experiment" not in proc.stdout and "tensorboard" not in proc.stdout.lower()
    assert f"{cfg.name}: running" in proc.stdout

    # --overwrite trains the finished run anew (never a replay); --quiet says only how each trial ended.
    written = (tmp_path / "runs" / cfg.name / "summary.json").stat().st_mtime_ns
    again = fedsim_cli("sweep", "rel.yaml", "--overwrite", "--quiet", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "runs" / cfg.name / "summary.json").stat().st_mtime_ns > written
    assert f"{cfg.name}: finished" in again.stdout
    assert not [line for line in again.stdout.splitlines() if line.startswith(f"{cfg.name}: ") and "finished" not in line]
