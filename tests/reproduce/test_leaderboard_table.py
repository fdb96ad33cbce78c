"""The leaderboard's table from run folders: the final round and the validation-picked round (never a round picked
on test), p10, Jain, time per round and the tuned settings per method and setting; PFLlib's best-round-on-test
number only beside fedsim's own best round on test of the same pooled accuracy, and left out where PFLlib scores
something else."""
import json
import math

import pytest
import yaml
from scipy import stats

from fedsim.metrics.confidence import t975
from fedsim.reproduce import leaderboard, leaderboard_ranking, leaderboard_table
from conftest import finished_leaderboard_run as finish

OVER = ["tune.grid={step: [0.05, 0.1], momentum: [0.0]}", "tune.own_trials=0"]  # 2 trials, one stage


def _chosen_plan(tmp_path, only: str):
    """A plan whose search has ended (trial 1 best on validation), its finals still to run."""
    kept = tmp_path / "kept"
    for item in leaderboard.plan("cpu", tmp_path, kept, OVER, only=only).search:
        finish(item, test=0.2, validation=0.1 + 0.1 * int(item.key.endswith("-t1")))
    return leaderboard.plan("cpu", tmp_path, kept, OVER, only=only), kept


def _curve(item, tests: list[float], sizes: list[int], picked_round: int, picked: float) -> None:
    """Rewrite a finished final run's per-client rows (two evaluated rounds) and its validation-picked round."""
    rounds = item.config.train.rounds
    rows = [{"client": c, "round": r, "n_train": 100, "n_test": n, "acc": acc, "validation_acc": 0.1}
            for r, accs in ((rounds // 2, [tests[0], tests[1]]), (rounds, [tests[2], tests[3]]))
            for c, (n, acc) in enumerate(zip(sizes, accs))]
    (item.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((item.folder / "summary.json").read_text())
    summary["best_round"]["acc"] |= {"round": picked_round, "mean": picked}
    (item.folder / "summary.json").write_text(json.dumps(summary))


def test_a_row_reports_the_final_and_the_validation_picked_round_at_the_chosen_settings(tmp_path):
    full, kept = _chosen_plan(tmp_path, "fedper")
    finals = {0: 0.6, 1: 0.7, 2: 0.5}
    for item in full.finals:
        if item.key == "pathological-fedper" and item.seed in finals:
            finish(item, test=finals[item.seed], validation=0.3)
            # the best round on test (client 1's 0.9 at mid-run) is neither the final nor the picked round
            picked_round = item.config.train.rounds // (2 if item.seed == 1 else 1)
            _curve(item, [0.1, 0.9, finals[item.seed], finals[item.seed]], [10, 30], picked_round, 0.65)
    table = leaderboard_table.evaluate(full, kept)
    cell = table["pathological"]["fedper"]
    assert cell["tuning"]["trial"] == "t1" and math.isclose(cell["tuning"]["validation"], 20.0)
    stats = cell["finals"]
    assert stats["seeds"] == 3 and stats["planned"] == full.tune.final_seeds
    assert math.isclose(stats["final"]["mean"], 60.0)
    assert math.isclose((stats["final"]["high"] - stats["final"]["low"]) / 2, t975(2) * 10.0 / math.sqrt(3))
    assert math.isclose(stats["picked"]["mean"], 65.0) and stats["picked_on"] == ["validation"]
    assert math.isclose(stats["seconds"], 1.0) and math.isclose(stats["cpu_seconds"], 0.5)
    assert math.isclose(stats["pooled_best"]["mean"], 70.0)  # (0.1 x 10 + 0.9 x 30) / 40, PFLlib's quantity
    text = leaderboard_table.render(table, "cpu", full, "cmd")
    chosen = full.searches[0].trials[1]
    assert f"lr {chosen['lr']:.3g}, momentum {chosen['momentum']:.3g} (trial t1; validation 20.00)" in text
    assert "| 60.00 ± 24.84 | 65.00 ± 0.00 | 40, 20, 40 |" in text  # each seed's picked round where they differ
    assert "| 100 | 0.50 (1.00) | 3 of 5 |" in text  # 100 images x 1 epoch per client and round
    assert "| 3 of 5 | 70.00 ± 0.00 | 63.53 ± 0.21 |" in text  # beside PFLlib's FedPer, pathological
    assert "| `fedper` | own model | searching" not in text
    assert "cut.** 20 clients" in text
    assert "PFLlib's protocol: **40 rounds instead of 2,000**, **10% of CIFAR-100's training images**, **20% of" in text
    assert "| `fedper` | fedper (keep_personal True) | sgd |" in text  # the final runs' receipt


def test_the_mechanism_column_flags_a_method_whose_mechanism_is_off_at_its_chosen_setting(tmp_path):
    full, kept = _chosen_plan(tmp_path, "fedamp")
    for item in full.finals:
        finish(item, test=0.5, validation=0.3)
        weight = 0.999999 if item.seed < 3 else 0.62  # local training at three of the five seeds
        rows = [json.loads(line) for line in (item.folder / "rounds.jsonl").read_text().splitlines()]
        rows[-1]["mechanism"] = {"fedamp_self_weight_mean": weight}
        (item.folder / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = leaderboard_table.evaluate(full, kept)
    assert table["pathological"]["fedamp"]["finals"]["mechanism"] == {
        "value": "self-weight 1", "flag": "acts as local training", "flagged": 3, "of": 5}
    text = leaderboard_table.render(table, "cpu", full, "cmd")
    assert "| self-weight 1; **acts as local training** (3 of 5 seeds) |" in text


def test_pfllibs_column_is_left_out_where_its_number_scores_something_else(tmp_path):
    full, kept = _chosen_plan(tmp_path, "fedproto")
    for item in full.finals:
        finish(item, test=0.5, validation=0.3)
    table = leaderboard_table.evaluate(full, kept)
    assert "pooled_best" not in table["pathological"]["fedproto"]["finals"]
    text = leaderboard_table.render(table, "cpu", full, "cmd")
    assert "| 5 of 5 | - | left out: PFLlib scores the nearest global prototype |" in text
    assert "69.18" not in text


def test_a_method_still_searching_or_without_a_choice_says_so(tmp_path):
    kept = tmp_path / "kept"
    searching = leaderboard.plan("cpu", tmp_path, kept, OVER, only="fedamp")
    trial_0 = [item for item in searching.search if item.key == "pathological-fedamp-t0"]  # both search seeds
    for item in trial_0:
        finish(item, test=0.2, validation=0.1)
    text = leaderboard_table.render(leaderboard_table.evaluate(searching, kept), "cpu", searching, "cmd")
    assert "| `fedamp` | own model | searching (1 of 2 trials done) | not run yet |" in text
    assert "Generated by `cmd` from 2 of 18 finished run folders (8 search runs, 10 final runs;" in text
    assert "0.0 h of rounds measured on this machine, 0.0 CPU-core hours over the 2 finished runs that recorded" in text
    for item in searching.search:
        if item not in trial_0:
            leaderboard.Diverged(kept).record(item, "loss is not finite")
    for item in searching.search:  # the finished one diverges too: every trial of the second setting diverged
        if item.config.data.partition.name == "dirichlet":
            leaderboard.Diverged(kept).record(item, "loss is not finite")
    ended = leaderboard.plan("cpu", tmp_path, kept, OVER, only="fedamp")
    text = leaderboard_table.render(leaderboard_table.evaluate(ended, kept), "cpu", ended, "cmd")
    assert "| `fedamp` | own model | none: every trial of fedamp failed" in text
    recorded = {item.config.name for item in searching.search if item not in trial_0} | {
        item.config.name for item in searching.search if item.config.data.partition.name == "dirichlet"}
    assert f"final runs; {len(recorded)} diverged, recorded and named below; 0.0 h of rounds" in text


def test_a_trial_that_diverged_is_named_while_its_search_still_runs(tmp_path):
    kept = tmp_path / "kept"
    searching = leaderboard.plan("cpu", tmp_path, kept, OVER, only="pfedme")
    for item in searching.search:  # trial 0 not run yet
        if item.key == "pathological-pfedme-t1":
            leaderboard.Diverged(kept).record(item, "loss is not finite")
    text = leaderboard_table.render(leaderboard_table.evaluate(searching, kept), "cpu", searching, "cmd")
    assert "| `pfedme` | own model | searching (1 of 2 trials done) | not run yet |" in text
    assert "| `pfedme` | algorithm.lambda" in text
    assert text.count("personal_lr choice [0.01, 0.05, 0.09, 0.1] | 1 |") == 1  # this setting's trial 1 alone
    assert text.count("personal_lr choice [0.01, 0.05, 0.09, 0.1] | - |") == 1


def test_seeds_that_ran_before_rounds_recorded_cpu_time_show_their_wall_time_alone(tmp_path):
    full, kept = _chosen_plan(tmp_path, "fedper")
    for item in full.finals:
        if item.key == "pathological-fedper":
            finish(item, test=0.6, validation=0.3)
            if item.seed == 0:  # one seed's rounds written before cpu_seconds existed
                rows = [json.loads(line) for line in (item.folder / "rounds.jsonl").read_text().splitlines()]
                (item.folder / "rounds.jsonl").write_text("".join(
                    json.dumps({k: v for k, v in row.items() if k != "cpu_seconds"}) + "\n" for row in rows))
    stats = leaderboard_table.evaluate(full, kept)["pathological"]["fedper"]["finals"]
    assert stats["cpu_seconds"] is None
    assert "| 1.00 wall | 5 of 5 |" in leaderboard_table.render(leaderboard_table.evaluate(full, kept), "cpu", full, "c")


def test_the_ranking_groups_rows_whose_seeds_all_finished_and_shows_their_ranks_over_the_rounds(tmp_path):
    kept = tmp_path / "kept"
    for item in leaderboard.plan("cpu", tmp_path, kept, OVER).search:
        if item.key.startswith("pathological-fedbn-"):  # every trial diverged: no settings chosen, no finals
            leaderboard.Diverged(kept).record(item, "loss is not finite")
        else:
            finish(item, test=0.2, validation=0.1)
    full = leaderboard.plan("cpu", tmp_path, kept, OVER)
    by_seed = {"fedper": [0.70, 0.73, 0.69, 0.72, 0.70], "local": [0.71, 0.70, 0.70, 0.71, 0.69],
               "fedavg": [0.50, 0.52, 0.48, 0.51, 0.49], "fedrep": [0.9, 0.9, 0.9], "ditto": [0.9, 0.9, 0.9, 0.9]}
    for item in full.finals:
        method = item.key.removeprefix("pathological-")  # the row (local_ft is another row of local)
        if item.key.startswith("pathological-") and item.seed < len(by_seed.get(method, [])):
            finish(item, test=by_seed[method][item.seed], validation=0.3)
        elif item.key == "pathological-ditto" and item.seed == 4:
            leaderboard.Diverged(kept).record(item, "loss is not finite")
    table = leaderboard_table.evaluate(full, kept)
    ranked = leaderboard_ranking.ranking(table["pathological"], full.final_rounds)
    assert ranked["groups"] == [["fedper", "local"], ["fedavg"]]  # local's interval covers 0; fedavg's does not
    text = leaderboard_table.render(table, "cpu", full, "cmd")
    assert "| A | `fedper` | 70.80 | - | - | - | 1 / 1 / 1 | +0.00 | 1 (round 40, 70.80) |" in text
    # fedper - local per seed: -1, +3, -1, +1, +1 points; Bonferroni over that step's 2 comparisons
    half = stats.t.ppf(1 - 0.05 / 4, 4) * math.sqrt(2.8) / math.sqrt(5)
    p_local = stats.ttest_1samp([-1, 3, -1, 1, 1], 0).pvalue  # Holm: the larger of two p-values, times 1
    assert f"| A | `local` | 70.20 | `fedper` | +0.60 [{0.6 - half:+.2f}, {0.6 + half:+.2f}] | {p_local:.3f} |" in text
    assert "| B | `fedavg` | 50.00 | `fedper` | +20.80 [" in text
    assert "**The order at this budget is stable**: Kendall's tau between the orders at round 30 and round 40 is 1.00" in text
    assert "Still running (not ranked until every final seed has finished): `fedavg_ft`, `local_ft`, `fedrep`" in text
    assert "not ranked, a final seed diverged: `ditto`." in text
    assert "not ranked, its search chose no settings: `fedbn`;" in text  # not "still running"
    assert text.count("| group | method |") == 1  # no final of the Dirichlet setting has finished: no ranking there


def test_holm_groups_and_the_orders_stability_over_the_rounds():
    from fedsim.reproduce import leaderboard_stats as more

    by_seed = {"a": {0: 80, 1: 81, 2: 79}, "b": {0: 79.5, 1: 81.2, 2: 78.8}, "c": {0: 60, 1: 61, 2: 59.5}}
    assert more.groups(by_seed)["groups"] == [["a", "b"], ["c"]]
    curves = {"a": {20: 50.0, 30: 60.0, 40: 61.0}, "b": {20: 55.0, 30: 62.0, 40: 60.0}, "c": {20: 40.0, 30: 45.0, 40: 59.0}}
    at = more.marks(40, [10, 20, 30, 40])
    assert at == {"R/2": 20, "3R/4": 30, "R": 40}
    stable = more.stability(curves, at)
    assert stable["moving"] == [("a", "b")] and stable["gain"] == {"a": 1.0, "b": -2.0, "c": 14.0}
    assert stable["tau"] == pytest.approx(1 / 3)  # one of three pairs flips
    assert stable["ranks"]["R/2"] == {"b": 1, "a": 2, "c": 3}
    # equal compute: b costs twice a's sample-steps a round, so it is read at round 20 of a's 40
    compute = more.equal_compute(curves, {"a": 100, "b": 200, "c": 100}, 40)
    assert compute["round"] == {"a": 40, "b": 20, "c": 40} and compute["ranks"] == {"a": 1, "c": 2, "b": 3}


@pytest.mark.parametrize("backend, marked, counted", [("ray", False, 1.0), ("local", True, 1.0), ("local", False, None)])
def test_a_local_runs_cpu_time_from_before_it_was_counted_once_is_no_measure(tmp_path, backend, marked, counted):
    """Rounds of a local-backend run written before ``cpu_counted_once`` counted its one process twice; a Ray run's
    rounds of then counted each process once, as every round does now."""
    from fedsim.reproduce.runner import run_cpu_seconds

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"engine": {"backend": backend}}))
    mark = {"cpu_counted_once": True} if marked else {}
    (tmp_path / "rounds.jsonl").write_text("".join(
        json.dumps({"round": r, "seconds": 1.0, "cpu_seconds": 0.5, **mark}) + "\n" for r in (1, 2)))
    assert run_cpu_seconds(tmp_path) == counted

