
import matplotlib.image
import pytest
from conftest import make_run, two_runs

from fedsim.metrics.report import write_report


def test_write_report_files_tables_and_saving(tmp_path):
    out = tmp_path / "report"
    written = write_report(two_runs(tmp_path / "runs"), out)
    names = {p.name for p in written}
    assert names == {"fairness_fedavg-run.png", "fairness_fedper-run.png", "final_distribution.png", "comparison.png",
                     "communication.png", "report.md"}
    assert all(p.parent == out and p.exists() for p in written)
    for png in (p for p in written if p.suffix == ".png"):
        image = matplotlib.image.imread(png)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0.01, png.name
    # The personalized run gets a second panel, so its figure is wider.
    assert (matplotlib.image.imread(out / "fairness_fedper-run.png").shape[1]
            > 1.5 * matplotlib.image.imread(out / "fairness_fedavg-run.png").shape[1])

    md = (out / "report.md").read_text()
    # Final round by hand: [0.2, 0.4, 0.6, 0.8] -> mean 50, population std sqrt(0.05) = 22.36, p10 at position
    # 0.3 -> 26, worst 10% of 4 clients = 1 client -> 20, Jain 2^2 / (4 * 1.2) = 0.833.
    assert ("| fedavg-run | fedavg | 2 | initial | 50.00 | 22.36 | 20.00 | 26.00 | 20.00 | 0.833 | 4.00 | 6.00 "
            "| 12.5 |") in md
    # [0.7, 0.7, 0.8, 0.8] -> Jain 9 / (4 * 2.26) = 0.996; personalized all 0.9 -> std 0, Jain 1.
    assert ("| fedper-run | fedper | 2 | initial | 75.00 | 5.00 | 70.00 | 70.00 | 70.00 | 0.996 | 3.00 | 4.00 "
            "| 12.5 |") in md
    assert "| fedper-run | fedper | 2 | personalized | 90.00 | 0.00 | 90.00 | 90.00 | 90.00 | 1.000 |" in md
    assert "Compared on bytes up + bytes down; reference: fedavg-run" in md
    assert "| fedavg-run | 10.00 | reference |" in md
    assert "| fedper-run | 7.00 | 30.00% |" in md
    for name in names - {"report.md"}:
        assert f"]({name})" in md


def test_legacy_runs_compare_on_bytes_up_only(tmp_path):
    runs = [make_run(tmp_path, "old-fedavg", "fedavg", [[0.5, 0.5]], bytes_round=(1, 2_000_000), legacy=True),
            make_run(tmp_path, "new-fedper", "fedper", [[0.6, 0.8]], bytes_round=(1_000_000, 1_000_000))]
    write_report(runs, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| old-fedavg | fedavg | 1 | initial | 50.00 | 0.00 | 50.00 | 50.00 | 50.00 | 1.000 | 4.00 | - | 12.5 |" \
        in md
    # Down bytes exist only for the new run, so only up bytes are compared: 2 MB vs 4 MB.
    assert "Compared on bytes up; reference: old-fedavg" in md
    assert "| new-fedper | 2.00 | 50.00% |" in md


def test_unfinished_run_without_summary(tmp_path):
    run_dir = make_run(tmp_path, "running", "fedper", [[0.2, 0.4], [0.4, 0.6]])
    (run_dir / "summary.json").unlink()
    write_report([run_dir], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| running | fedper | 2 (no summary.json) | initial | 50.00 |" in md


def test_folder_without_metrics_is_a_one_line_error(tmp_path):
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"not-a-run: no client metrics") as err:
        write_report([empty], tmp_path / "out")
    assert "\n" not in str(err.value)


def test_runs_differing_only_in_seed_are_aggregated_with_a_confidence_interval(tmp_path):
    runs = [make_run(tmp_path / "runs", f"fedper-k4-s{seed}", "fedper", [[0.2, 0.4], [m - 0.1, m + 0.1]], seed=seed)
            for seed, m in enumerate((0.5, 0.6, 0.7))]
    runs.append(make_run(tmp_path / "runs", "fedavg-k4-s0", "fedavg", [[0.1, 0.1], [0.2, 0.2]]))  # other settings
    write_report(runs, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    # Final client means 50, 60, 70 %: mean 60, sample sd 10, t(0.975, 2) = 4.303 -> half width 24.84.
    assert "| fedper-k4 | 0, 1, 2 | initial | 60.00 [35.16, 84.84] | 10.00 |" in md
    assert "fedavg-k4" not in md.split("## Across seeds")[1].split("![")[0]  # a single seed is no group
    image = matplotlib.image.imread(tmp_path / "report" / "seeds.png")
    assert image.shape[1] > 300 and image.std() > 0.01


def test_what_a_users_module_logged_gets_its_own_table(tmp_path):
    import json

    run = make_run(tmp_path, "own", "fedper", [[0.5, 0.7], [0.6, 0.8]])
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:  # what TwoPartModule-style self.log calls leave in a record
        row["val_margin"] = 0.1 * (row["client"] + 1) * row["round"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = (tmp_path / "out").joinpath("report.md")
    write_report([run], tmp_path / "out")
    text = md.read_text()
    assert "## Logged by the modules" in text
    assert "| own | val_margin | 2 | 0.3 | 0.1 | 0.2 |" in text  # the last round's two clients: 0.2 and 0.4


@pytest.mark.parametrize("damage, message", [
    (lambda lines: lines[:2] + ["null"] + lines[2:], ":3: not a result row"),
    (lambda lines: lines[:1] + ['{"client": 0, "acc": 0.5}'] + lines[1:], ":2: not a result row"),
    (lambda lines: [lines[0].replace('"acc": 0.5', '"acc": "0.5"')] + lines[1:], ":1: not a client record"),
    (lambda lines: [lines[0][:25]] + lines[1:], ":1: not a result row"),  # cut mid-file
    (lambda lines: [lines[0].replace('"acc": 0.5', '"acc": NaN')] + lines[1:], ":1: not a client record"),
    (lambda lines: [lines[0].replace('"acc": 0.5', '"acc": 1e300')] + lines[1:], ":1: not a client record"),
])
def test_report_refuses_damaged_rows_with_one_line(tmp_path, capsys, damage, message):
    from fedsim.cli.main import main

    run = make_run(tmp_path, "hurt", "fedavg", [[0.5, 0.7], [0.6, 0.8]])
    path = run / "metrics.jsonl"
    path.write_text("\n".join(damage(path.read_text().splitlines())) + "\n")
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "metrics.jsonl" in err


@pytest.mark.parametrize("config", ["a: !!python/object/apply:os.system ['true']\n",
                                    "l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(  # an alias bomb: 9^10 values
                                        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)),
                                    "- just\n- a list\n"])
def test_report_reads_config_yaml_strictly(tmp_path, capsys, config):
    from fedsim.cli.main import main

    run = make_run(tmp_path, "odd", "fedavg", [[0.5, 0.7]])
    (run / "config.yaml").write_text(config)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config.yaml" in err


def test_the_report_shows_validation_and_reads_each_run_at_the_round_validation_picks(tmp_path):
    import json

    run = make_run(tmp_path / "runs", "val-run", "fedavg", [[0.5, 0.5], [0.7, 0.7], [0.6, 0.6]])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for rec in records:  # validation's best is round 3, test's round 2
        rec["validation_acc"] = {1: 0.4, 2: 0.5, 3: 0.55}[rec["round"]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in records))
    plain = make_run(tmp_path / "runs", "plain-run", "fedavg", [[0.5, 0.5], [0.7, 0.7], [0.6, 0.6]])
    write_report([run, plain], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| val-run | fedavg | 3 | initial, validation | 55.00 |" in md
    assert "| val-run | initial | 3 | validation | 60.00 | 60.00 |" in md
    assert "| plain-run | initial | 2 | best on test, as PFLlib reports; not a selection | 70.00 | 60.00 |" in md


def test_the_report_gives_each_runs_receipt_and_names_what_the_runs_differ_in(tmp_path):
    from fedsim.config import validate

    runs = two_runs(tmp_path / "runs")
    for run, lr in zip(runs, (0.05, 0.01)):
        cfg = validate({"name": run.name, "algorithm": run.name.split("-")[0], "seed": 0,
                        "train": {"rounds": 2, "body": {"lr": lr, "momentum": 0.0}}, "eval": {"finetune_epochs": 3}})
        (run / "config.yaml").write_text(__import__("yaml").safe_dump(cfg.model_dump()))
    write_report(runs, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert ("| fedavg-run | fedavg | sgd | body 0.05 / head 0.01 | body 0 / head 0.9 | 2 | 4 epoch(s) of batch 50, "
            "f = 1 | initial (the model each client holds) | final; best round on test, shown as PFLlib reports it, "
            "not a selection | 0 |") in md
    assert "initial (the model each client holds); personalized: fine-tuned 3 epoch(s) of full at train lr" in md
    assert "| fedper-run | fedper (keep_personal True) | sgd | 0.01 |" in md  # the method's own settings too
    # keep_personal is FedPer's own parameter: FedAvg has none, so the runs differ in it by differing in method.
    assert "The runs differ in: algorithm.name, train.body.lr." in md


def test_a_runs_receipt_prints_the_optimizer_it_set_up_not_the_configs_unused_one(tmp_path):
    """A module's own Adam at 0.01 under a config that says sgd at 0.05: `fedsim report` prints Adam's (issue 67)."""
    import json

    from fedsim.config import validate

    runs = two_runs(tmp_path / "runs")
    for run in runs:
        cfg = validate({"name": run.name, "algorithm": "fedavg", "train": {"body": {"lr": 0.05}, "head": {"lr": 0.05}}})
        (run / "config.yaml").write_text(__import__("yaml").safe_dump(cfg.model_dump()))
    summary = json.loads((runs[0] / "summary.json").read_text())
    summary["optimizers"] = [f"{part}: Adam (optimizer 0, group 0, 2 tensors): lr 0.01, betas (0.9, 0.999), eps 1e-08, "
                             "weight_decay 0" for part in ("body", "head")]
    (runs[0] / "summary.json").write_text(json.dumps(summary))
    write_report(runs, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"| {runs[0].name} | fedavg | Adam | 0.01 | betas (0.9, 0.999) |" in md
    assert f"| {runs[1].name} | fedavg | sgd | 0.05 |" in md  # a run that predates summary.json's optimizers


def test_time_to_accuracy_on_the_virtual_clock_gets_its_table(tmp_path):
    import json

    run_dir = make_run(tmp_path / "runs", "timed", "fedavg", [[0.4, 0.5], [0.6, 0.7]])
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    (run_dir / "rounds.jsonl").write_text("".join(json.dumps({**r, "sim_time_s": 100.0 * r["round"]}) + "\n"
                                                  for r in rows))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["system"] = {"sim_seconds": 200.0, "dropouts": 0, "late": 0,
                         "time_to_accuracy": {"acc": {"0.5": 200.0, "0.9": None}}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    write_report([run_dir], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| timed | initial | 50 | 200.0 |" in md and "| timed | initial | 90 | never reached |" in md


def test_a_methods_server_side_mechanism_gets_its_own_table(tmp_path):
    """rounds.jsonl's mechanism (Algorithm.mechanism, e.g. FedAMP's self-weights) at the first and the last round."""
    import json

    run = make_run(tmp_path, "amp", "fedamp", [[0.5, 0.7], [0.6, 0.8]])
    path = run / "rounds.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, weight in zip(rows, (0.8, 0.6)):
        row["mechanism"] = {"fedamp_self_weight_mean": weight}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report([run], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## The methods' mechanism" in text
    assert "| amp | fedamp_self_weight_mean | 1 | 0.8 | 2 | 0.6 |" in text


def test_dp_runs_get_their_epsilon_by_the_last_recorded_round_with_what_it_means(tmp_path):
    """rounds.jsonl's privacy/epsilon (a run in progress too) with summary.json's delta, z, accountant, sampling."""
    import json

    run = make_run(tmp_path, "dp", "fedavg", [[0.5, 0.7], [0.6, 0.8]])
    make_run(tmp_path, "plain", "fedavg", [[0.5, 0.7], [0.6, 0.8]])
    path = run / "rounds.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, eps in zip(rows, (0.7, 1.25)):
        row["privacy/epsilon"] = eps
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((run / "summary.json").read_text())
    summary["privacy"] = {"dp": "central", "epsilon": 1.25, "delta": 1e-3, "noise_multiplier": 1.1,
                          "accountant": "rdp", "sampling": "poisson", "q": 0.1}
    (run / "summary.json").write_text(json.dumps(summary))
    write_report([run, tmp_path / "plain"], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Privacy spent" in text
    assert "| dp | central | 2 | 1.25 | - | 0.001 | 1.1 | rdp | poisson (0.1) |" in text
    assert "| plain |" not in text.split("## Privacy spent")[1].split("##")[0]
