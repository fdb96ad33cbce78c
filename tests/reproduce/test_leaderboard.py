"""`fedsim reproduce leaderboard`'s plan: a two-stage search per row and setting (the shared grid at each
method's defaults, then its own `tunable` parameters at that choice, the same count for every row), the
choice read from validation scores only, then the chosen settings at the final seeds; a diverged trial is left out
and never retried; a resumed leaderboard plans only the runs its kept archive lacks; the dry run counts them."""
import multiprocessing
import re
import shutil

import pytest
from conftest import finished_leaderboard_run as finish

from fedsim.cli.main import main
from fedsim.errors import ConfigError, TrainingDiverged
from fedsim.reproduce import archive, leaderboard
from fedsim.reproduce.restore import SET_ASIDE, restore_kept
from fedsim.sweep.runs import status


GRID = "tune.grid={step: [0.05, 0.1, 0.2], momentum: [0.0]}"  # 3 stage-1 trials
NO_OWN = "tune.own_trials=0"


def test_every_method_is_searched_with_one_budget_before_any_final(tmp_path):
    full = leaderboard.plan("cpu", tmp_path, tmp_path / "kept")
    tune = full.tune
    assert len(full.searches) == len(leaderboard.BOARD.settings) * len(leaderboard.BOARD.entries) and not full.finals
    assert len(full.waiting()) == len(full.searches)  # no choice before its trials have run
    grid = len(tune.grid.step) * len(tune.grid.momentum)
    assert {len(s.runs) for s in full.searches} == {grid} and {s.first for s in full.searches} == {grid}
    assert {len(trial) for s in full.searches for trial in s.runs} == {len(tune.seeds)} and len(tune.seeds) >= 2
    assert {item.config.train.rounds for item in full.search} == {full.rounds}
    assert {item.seed for item in full.search} == set(tune.seeds)
    assert not set(tune.seeds) & set(range(tune.final_seeds))  # the choice never reads a run the table reports
    for k in range(grid):  # trial k: the same step for every row and setting
        lrs = {(c.train.body.lr, c.train.head.lr) for s in full.searches for c in (item.config for item in s.runs[k])}
        assert len(lrs) == 1
    fedrep = next(s for s in full.searches if s.entry.method == "fedrep")
    assert "algorithm.head_epochs" in fedrep.own  # searched in stage 2, at its defaults in stage 1
    assert {item.config.algorithm.params["head_epochs"] for trial in fedrep.runs for item in trial} == {10}
    keys = list(dict.fromkeys(item.key for item in full.search))  # trial-major: every row's trial 0 first
    assert keys[:2] == ["pathological-fedavg-t0", "pathological-fedavg_ft-t0"]
    fedavg_ft = next(s for s in full.searches if s.entry.name == "fedavg_ft")
    assert fedavg_ft.runs[0][0].config.eval.finetune_epochs == 5 and fedavg_ft.entry.method == "fedavg"
    dirichlet = next(s for s in full.searches if s.setting == "dirichlet" and s.entry.method == "fedbabu")
    assert dirichlet.runs[0][0].config.data.partition.beta == 0.1
    assert dirichlet.runs[0][0].config.eval.finetune_epochs == 5
    assert full.search[0].config.data.validation > 0
    with pytest.raises(ConfigError, match="--only: the leaderboard has no method 'fedfoo'"):
        leaderboard.plan("cpu", tmp_path, tmp_path, only="fedfoo")
    with pytest.raises(ConfigError, match="^tune.own_trials: Input should be greater than or equal to 0$"):
        leaderboard.plan("cpu", tmp_path, tmp_path, ["tune.own_trials=-1"])


def test_stage_two_is_planned_at_stage_ones_choice_and_the_choice_reads_validation_only(tmp_path):
    kept, over = tmp_path / "kept", [GRID, "tune.own_trials=1"]
    for search in leaderboard.plan("cpu", tmp_path, kept, over, only="fedper").searches:
        assert len(search.runs) == 3  # stage 2 waits for stage 1's choice
        for k, trial in enumerate(search.runs):  # trial 2 is best on validation and worst on test
            for item in trial:
                finish(item, test=0.9 - 0.3 * k, validation=0.3 + 0.2 * k)
    second = leaderboard.plan("cpu", tmp_path, kept, over, only="fedper")
    assert all(len(s.runs) == 4 and s.choice is None for s in second.searches)
    refined = second.searches[0].trials[3]  # FedPer has no own parameters: the chosen step refined
    assert refined["lr"] == pytest.approx(0.2 / 2 ** 0.5, rel=1e-5) and refined["momentum"] == 0.0
    assert second.searches[0].runs[3][0].key == "pathological-fedper-o0"
    for search in second.searches:
        for item in search.runs[3]:
            finish(item, test=0.99, validation=0.5)  # best on test, worse on validation than trial 2
    full = leaderboard.plan("cpu", tmp_path, kept, over, only="fedper")
    assert all(s.choice is not None and s.choice.trial == 2 for s in full.searches) and not full.waiting()
    assert len(full.finals) == 2 * full.tune.final_seeds
    assert [p.seed for p in full.finals[:2]] == [0, 0]  # seed-major
    for item in full.finals:
        assert (item.config.train.body.lr, item.config.train.body.momentum) == (0.2, 0.0)
        assert item.config.train.rounds == full.final_rounds == 40
    assert full.finals[0].config.name == "leaderboard-cpu-pathological-fedper-s0"
    assert len(leaderboard.plan("cpu", tmp_path, kept, over, only="fedper", final_seeds=7).finals) == 14


def test_a_kept_run_of_other_settings_is_never_read_as_this_plans_result(tmp_path):
    """A run folder of the same name made by an earlier plan (other settings: `changed`) is not a result of this
    plan: the search waits for its own run instead of choosing from the old one."""
    kept, over = tmp_path / "kept", [GRID, NO_OWN]
    for item in leaderboard.plan("cpu", tmp_path, kept, [*over, "train.eval_every=2"], only="fedper").search:
        finish(item, test=0.5, validation=0.4)
    again = leaderboard.plan("cpu", tmp_path, kept, over, only="fedper")
    assert {status(item.config) for item in again.search} == {"changed"}
    assert all(item.result() is None for item in again.search)
    assert len(again.waiting()) == 2 and not again.finals


def test_a_diverged_trial_is_left_out_of_the_choice_and_never_retried(tmp_path, monkeypatch):
    kept = tmp_path / "kept"
    searched = leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN], only="fedamp")
    calls = []

    def execute(items, say, **_):  # the runner's: a finished run is skipped
        if not (items[0].folder / "summary.json").exists():
            calls.append(items[0].config.name)
            if items[0].key.endswith("-t1"):
                raise TrainingDiverged("client 3, round 2: training loss is not finite")
            finish(items[0], test=0.5, validation=0.4)

    monkeypatch.setattr(leaderboard, "execute", execute)
    leaderboard.complete(searched.search, kept, say=lambda _: None)
    leaderboard.complete(searched.search, kept, say=lambda _: None)  # resumed: the diverged trial is not retried
    assert calls == [p.config.name for p in searched.search]
    full = leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN], only="fedamp")
    assert all(s.choice is not None and s.choice.trial == 0 and s.choice.failed == [1] for s in full.searches)
    changed = leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN, "train.eval_every=2"], only="fedamp")
    assert leaderboard.Diverged(kept).of(changed.search[1]) is None  # other settings: run again


def test_a_search_every_trial_of_which_diverged_chooses_nothing(tmp_path):
    kept = tmp_path / "kept"
    searched = leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN], only="fedamp")
    for item in searched.search:
        leaderboard.Diverged(kept).record(item, "loss is not finite")
    full = leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN], only="fedamp")
    assert all(s.choice is None and "every trial of fedamp failed" in str(s.failed) for s in full.searches)
    assert not full.finals and not full.waiting()


def test_processes_sharing_a_kept_folder_keep_each_others_diverged_runs(tmp_path):
    """Two lanes complete one leaderboard into one kept folder, each opened before the other records: neither
    drops the other's record, nor retries a run the other has recorded."""
    kept = tmp_path / "kept"
    search = leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN], only="fedamp").search
    first, second = leaderboard.Diverged(kept), leaderboard.Diverged(kept)
    first.record(search[0], "loss is not finite")
    assert second.of(search[0]) == "loss is not finite"
    second.record(search[1], "loss is not finite at round 2")
    assert [leaderboard.Diverged(kept).of(item) for item in search[:2]] == [
        "loss is not finite", "loss is not finite at round 2"]


def test_diverged_runs_recorded_at_once_by_several_processes_are_all_kept(tmp_path):
    kept = tmp_path / "kept"
    search = leaderboard.plan("cpu", tmp_path, kept, ["tune.grid={step: [0.05, 0.1, 0.2, 0.4], momentum: [0.0]}", NO_OWN], only="fedamp").search
    fork = multiprocessing.get_context("fork")  # the planned runs reach the children without pickling

    def record(items):
        for item in items:
            leaderboard.Diverged(kept).record(item, f"{item.config.name} diverged")

    workers = [fork.Process(target=record, args=(search[i::4],)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert all(worker.exitcode == 0 for worker in workers)
    assert [leaderboard.Diverged(kept).of(item) for item in search] == [f"{i.config.name} diverged" for i in search]


@pytest.mark.parametrize("content, says", [("{", "unreadable"), ('{"run": "diverged"}', "not a record of")])
def test_a_damaged_record_of_diverged_runs_is_named_with_its_fix(tmp_path, content, says):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "diverged.json").write_text(content)
    with pytest.raises(ConfigError, match=rf"diverged\.json: {says}.*restore it from git, or remove it"):
        leaderboard.plan("cpu", tmp_path, kept, [GRID, NO_OWN], only="fedamp")


def test_a_resumed_leaderboard_plans_only_what_its_kept_runs_lack(tmp_path):
    """A partial set of kept runs (here: the search and two final seeds), put back into an empty runs folder on
    another machine: they read as finished, so only the rest is left to run."""
    kept, first, fresh = tmp_path / "kept", tmp_path / "here", tmp_path / "clone"
    over = [GRID, NO_OWN]
    for item in leaderboard.plan("cpu", first, kept, over, only="fedper").search:
        finish(item, test=0.5, validation=0.4)
        archive.keep(item.folder, kept)
    for item in leaderboard.plan("cpu", first, kept, over, only="fedper").finals:
        if item.seed < 2:
            finish(item, test=0.5, validation=0.4)
            archive.keep(item.folder, kept)
    after, count = leaderboard.restored(lambda: leaderboard.plan("cpu", fresh, kept, over, only="fedper"), kept)
    assert count == len(after.search) + 2 * 2  # the search, then (its choices read) 2 settings x final seeds 0, 1
    left = [p for p in after.runs if status(p.config) != "finished"]
    assert sorted({p.seed for p in left}) == [2, 3, 4] and len(left) == 2 * 3


def test_a_kept_run_replaces_a_folder_of_other_settings_which_is_set_aside_not_deleted(tmp_path):
    """A checkout whose runs folder holds an earlier plan's folders under the same names (``changed``) reads the
    kept runs of this plan, as a fresh clone does, instead of training them again; the old folders are moved to
    ``.set-aside/``. A kept run of other settings than the plan's never replaces anything."""
    kept, runs, over = tmp_path / "kept", tmp_path / "runs", [GRID, NO_OWN]
    search = leaderboard.plan("cpu", runs, kept, over, only="fedper").search
    for item in search:
        finish(item, test=0.5, validation=0.4)
        archive.keep(item.folder, kept)
        shutil.rmtree(item.folder)
    for item in leaderboard.plan("cpu", runs, kept, [*over, "train.eval_every=2"], only="fedper").search:
        finish(item, test=0.3, validation=0.2)  # the earlier plan's folders, where this plan's runs go
    assert {status(item.config) for item in search} == {"changed"}
    assert restore_kept(search, kept) == len(search)
    assert {status(item.config) for item in search} == {"finished"}
    aside = sorted((runs / SET_ASIDE).iterdir())
    assert len(aside) == len(search) and all((folder / "summary.json").exists() for folder in aside)

    other = leaderboard.plan("cpu", runs, kept, [*over, "train.eval_every=2"], only="fedper").search
    assert restore_kept(other, kept) == 0  # the archive holds them at other settings: the folders stand
    assert {status(item.config) for item in other} == {"changed"}


def test_one_command_runs_both_stages_then_the_finals(tmp_path, monkeypatch, data_root):
    """`fedsim reproduce leaderboard --only ROW` plans stage 2 once stage 1 has run, and the finals once stage 2 has,
    in one invocation (each run here finished by a stand-in for the runner)."""
    ran: list[str] = []

    def complete(items, kept, max_concurrent=None, say=None):
        for item in items:
            if item.result() is None:
                ran.append(item.key)
                finish(item, test=0.5, validation=0.4)

    monkeypatch.setattr(leaderboard, "complete", complete)
    over = ["tune.grid={step: [0.05, 0.1], momentum: [0.0]}", "tune.own_trials=1", "tune.rounds=2",
            "tune.final_rounds=2", "tune.final_seeds=2"]
    assert main(["reproduce", "leaderboard", "--only", "fedavg", "--runs", str(tmp_path), "--kept",
                 str(tmp_path / "kept"), "--report", str(tmp_path / "board.md"), *over]) == 0
    stages = [key.rsplit("-", 1)[-1][0] if key.rsplit("-", 1)[-1][0] in "to" else "final" for key in ran]
    assert stages == ["t"] * 8 + ["o"] * 4 + ["final"] * 4  # 2 settings x (2 grid + 1 own) x 2 seeds; 2 x 2 finals


def test_the_dry_run_counts_the_search_and_the_finals_waiting_for_it(tmp_path, capsys, data_root):
    """The finals still waiting for their search are estimated at the finals' rounds, not the search's: here 4
    against 2, so each final is twice a trial's work (no fine-tuning in the base config)."""
    assert main(["reproduce", "leaderboard", "--dry-run", "--only", "fedavg", "--runs", str(tmp_path),
                 "--kept", str(tmp_path / "kept"), "tune.grid={step: [0.05, 0.1], momentum: [0.0]}", NO_OWN, "tune.rounds=2",
                 "tune.final_rounds=4"]) == 0
    out = capsys.readouterr().out
    assert "leaderboard-cpu-pathological-fedavg-t1-s1000: new" in out
    assert "leaderboard-cpu-pathological-fedavg-t1-s1001: new" in out
    searched = int(re.search(r"planned now: 8 search runs, 0 final runs \(8 new\); ([\d,]+) sample-steps", out)[1]
                   .replace(",", ""))
    assert (f"waiting for their search: 10 final runs (2 method x setting searches not ended), about "
            f"{10 * 2 * searched // 8:,} sample-steps (each at its method's mean trial, run for the finals' 4 rounds)") in out
    assert "budget: stage 1: a grid of 2 effective steps lr/(1-m) [0.05, 0.1] x momentum [0.0]" in out


def test_the_dry_run_lists_a_diverged_run_as_such_and_leaves_it_out_of_what_is_left(tmp_path, capsys, data_root):
    """The leaderboard never retries a run recorded as diverged, so the dry run of a fully run leaderboard says
    "left: 0 runs" even where a trial diverged: here the search has ended (trial 1 is chosen) and only its
    finals are left."""
    kept = tmp_path / "kept"
    over = ["tune.grid={step: [0.05, 0.1], momentum: [0.0]}", NO_OWN, "tune.rounds=2", "tune.final_rounds=2"]
    search = leaderboard.plan("cpu", tmp_path, kept, over, only="fedavg").search
    leaderboard.Diverged(kept).record(search[0], "loss is not finite")
    for item in search[1:]:
        finish(item, test=0.5, validation=0.4)
    assert main(["reproduce", "leaderboard", "--dry-run", "--only", "fedavg", "--runs", str(tmp_path),
                 "--kept", str(kept), *over]) == 0
    out = capsys.readouterr().out
    assert f"{search[0].config.name}: diverged (recorded; not retried)" in out
    assert "planned now: 8 search runs, 10 final runs (1 diverged (recorded; not retried), 7 finished, 10 new)" in out
    assert "\nleft: 10 runs" in out  # the finals of the chosen trial, not the diverged one


def test_the_paper_scale_plan_is_valid(tmp_path):
    full = leaderboard.plan("paper", tmp_path, tmp_path / "kept", only="fedavg")
    assert {item.config.train.rounds for item in full.search} == {2000}


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_the_base_configs_tune_methods_are_the_leaderboards_rows(scale):
    """The file's tune.methods (what `fedsim run` and `fedsim tune` read) names exactly the leaderboard's methods."""
    from fedsim.reproduce.leaderboard import BOARD, base_file

    assert base_file(scale)["tune"]["methods"] == list(dict.fromkeys(entry.method for entry in BOARD.entries))
