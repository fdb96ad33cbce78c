"""A reproduction run that starts from another run's model (LG-FedAvg from the same seed's FedAvg, as the FedBABU
authors' run_lg_fedavg.sh): planned after it, seed by seed, refused while it is missing or unfinished, run again
when it ran again; and one tiny chain end to end."""
import dataclasses
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedsim.algorithms import build_algorithm
from fedsim.errors import ConfigError
from fedsim.models.lightning import network_of
from fedsim.plan.build import initial_client, load_inputs
from fedsim.reproduce import PAPERS
from fedsim.reproduce.claims import Arm, Claim, Paper, RunFolder
from fedsim.reproduce.restore import restore_kept
from fedsim.reproduce.runner import execute, plan, waves
from fedsim.sweep.runs import claimed
from test_reproduce import TINY

PAPER = PAPERS["fedbabu"]
# Read as declared: the CPU scale's plain-SGD setting (fedbabu.py) would plan each run twice.
LG_ONLY = (Claim("lg", "LG-FedAvg alone", "-", (Arm("LG", "lg_fedavg"),), (), "-", at_settings=False),)


def _plan(tmp_path, data_root, seeds=2, claims=LG_ONLY, extra=TINY):
    return plan(PAPER, claims, "cpu", seeds, tmp_path, [f"data.root={data_root}", *extra])


def test_the_dependency_is_planned_first_in_every_seed_even_when_no_claim_reads_it(tmp_path, data_root):
    planned = _plan(tmp_path, data_root, seeds=3)
    assert [(p.key, p.seed) for p in planned] == [(k, s) for s in range(3) for k in ("fedavg", "lg_fedavg")]
    [fedavg, lg] = planned[:2]
    assert fedavg.needs == () and lg.needs == (fedavg.config,)
    # The whole FedBABU suite: seed-major, FedAvg before LG-FedAvg in every seed, every run once.
    full = _plan(tmp_path, data_root, claims=PAPER.claims)
    for seed in (0, 1):
        keys = [p.key for p in full if p.seed == seed]
        assert keys.index("fedavg") < keys.index("lg_fedavg") and len(keys) == len(set(keys))
    assert [p.seed for p in full] == sorted(p.seed for p in full)


def test_the_command_records_the_run_it_starts_from_relative_to_where_it_runs(tmp_path, data_root, monkeypatch,
                                                                             capsys):
    """`fedsim reproduce` given --runs as an absolute path under the current directory (as a script passes it):
    every run's config names its runs folder and the FedAvg run LG-FedAvg starts from relative to the directory, so
    a kept run's config.yaml reads the same on every clone; a runs folder outside it stays absolute."""
    import fedsim.reproduce.runner as runner
    from fedsim.cli.main import main

    planned = []
    monkeypatch.setattr(runner, "plan", lambda *a, **k: planned.extend(plan(*a, **k)) or planned)
    monkeypatch.setitem(PAPERS, "fedbabu", dataclasses.replace(PAPER, claims=LG_ONLY))
    (tmp_path / "clone").mkdir()
    monkeypatch.chdir(tmp_path / "clone")
    command = ["reproduce", "fedbabu", "--seeds", "1", "--dry-run", "--kept", str(tmp_path / "kept"),
               f"data.root={data_root}", *TINY]
    assert main([*command, "--runs", str(tmp_path / "clone" / "runs")]) == 0, capsys.readouterr().err
    left = capsys.readouterr().out.splitlines()[-1]  # nothing finished: timed from a few steps of the first run left
    assert left.startswith("left: 2 runs") and "sample-steps/s the first run left trained at" in left, left
    fedavg, lg = planned
    assert (fedavg.config.out_dir, lg.config.model.init_from) == ("runs", "runs/fedbabu-cpu-fedavg-s0")
    planned.clear()
    assert main([*command, "--runs", str(tmp_path / "elsewhere")]) == 0, capsys.readouterr().err
    assert planned[1].config.model.init_from == str(tmp_path.resolve() / "elsewhere" / "fedbabu-cpu-fedavg-s0")


def test_a_run_listed_before_the_run_it_needs_still_comes_after_it(tmp_path, data_root):
    runs = {"after": {"algorithm": "lg_fedavg", "model.init_from": RunFolder("first")}, "first": {}}
    paper = Paper("toy", "toy", PAPER.bases, runs, (Claim("c", "c", "-", (Arm("A", "after"),), (), "-"),))
    assert [p.key for p in plan(paper, paper.claims, "cpu", 1, tmp_path, [f"data.root={data_root}"])] == \
        ["first", "after"]
    circle = Paper("toy", "toy", PAPER.bases, {**runs, "first": {"model.init_from": RunFolder("after")}}, paper.claims)
    with pytest.raises(ConfigError, match="in a circle"):
        plan(circle, circle.claims, "cpu", 1, tmp_path, [f"data.root={data_root}"])
    unknown = Paper("toy", "toy", PAPER.bases, {"after": runs["after"]}, paper.claims)
    with pytest.raises(ConfigError, match="'first', which the paper does not define"):
        plan(unknown, unknown.claims, "cpu", 1, tmp_path, [f"data.root={data_root}"])


@pytest.mark.parametrize("scale, rounds", [("cpu", 5), ("paper", 20)])
def test_lg_fedavg_starts_from_its_own_seeds_fedavg_as_the_authors_run_it(tmp_path, data_root, scale, rounds):
    """run_lg_fedavg.sh after FedAvg's 80 rounds at tau = 4: --epochs 20 (a quarter) --lr 0.001, no lr decay in
    main_lg.py, `linear.weight` / `linear.bias` (the output layer) the only averaged keys."""
    planned = plan(PAPER, LG_ONLY, scale, 2, tmp_path, [f"data.root={data_root}"])
    for seed in (0, 1):
        [fedavg] = [p for p in planned if p.key == "fedavg" and p.seed == seed]
        [lg] = [p for p in planned if p.key == "lg_fedavg" and p.seed == seed]
        assert lg.config.model.init_from == str(tmp_path / f"fedbabu-{scale}-fedavg-s{seed}") == str(fedavg.folder)
        t = lg.config.train
        assert t.rounds == fedavg.config.train.rounds // 4 == rounds and t.eval_every == rounds
        for part in (t.body, t.head):
            assert (part.lr, part.schedule, part.momentum, part.weight_decay) == (0.001, "constant", 0.9, 0.0)
        assert t.local_epochs == fedavg.config.train.local_epochs and t.fraction == fedavg.config.train.fraction
    if scale == "cpu":
        cfg = lg.config.model_copy(update={"model": lg.config.model.model_copy(update={"init_from": None})})
        algorithm = build_algorithm(cfg)
        module, keys = initial_client(cfg, algorithm, 100, (3, 32, 32))
        shared = algorithm.shared_keys(keys)
        assert set(shared) == {"classifier.1.weight", "classifier.1.bias"}  # the head: the authors' linear.*
        assert network_of(module).classifier[1].weight.shape == (100, 256)
    # The random-start LG-FedAvg stays a run of its own: FedAvg's rounds and lr, no init_from.
    [random] = plan(PAPER, (Claim("r", "r", "-", (Arm("R", "lg_fedavg-random"),), (), "-", at_settings=False),), scale, 1,
                    tmp_path,
                    [f"data.root={data_root}"])
    assert random.needs == () and random.config.model.init_from is None and random.config.train.rounds == 4 * rounds


def _write_config(cfg) -> None:
    """A run folder that started and holds no summary: resumable, not finished."""
    folder = Path(cfg.out_dir) / cfg.name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))


def test_a_run_whose_dependency_is_missing_or_unfinished_is_refused_in_one_line(tmp_path, data_root):
    fedavg, lg = _plan(tmp_path, data_root, seeds=1)
    with pytest.raises(ConfigError) as missing:
        execute([lg], say=lambda line: None)
    text = str(missing.value)
    assert "\n" not in text and text.startswith(f"reproduce: {lg.config.name} starts from {fedavg.config.name}")
    assert "has no run folder" in text and f"bring {fedavg.config.name} to completion first" in text
    assert not lg.folder.exists()
    _write_config(fedavg.config)
    with pytest.raises(ConfigError, match=f"{fedavg.config.name} has not finished"):
        execute([lg], say=lambda line: None)
    assert not lg.folder.exists()


def test_a_dependency_another_process_runs_skips_its_dependents(tmp_path, data_root):
    fedavg, lg = _plan(tmp_path, data_root, seeds=1)
    said = []
    with claimed(fedavg.config) as mine:  # this process stands in for another `fedsim reproduce` training FedAvg
        assert mine
        execute([fedavg, lg], say=said.append)
    assert said[0] == f"[1/2] {fedavg.config.name}: another process is running it, skipped"
    assert said[1].startswith(f"[2/2] {lg.config.name}: starts from {fedavg.config.name}'s model, which another "
                              "process is running; skipped")


def test_max_concurrent_runs_dependencies_in_an_earlier_sweep_and_refuses_an_unfinished_one(tmp_path, data_root,
                                                                                          monkeypatch):
    import fedsim.sweep.executor as executor

    planned = _plan(tmp_path, data_root, seeds=2)
    assert [[p.key for p in wave] for wave in waves(planned)] == [["fedavg", "fedavg"], ["lg_fedavg", "lg_fedavg"]]
    handed = []
    monkeypatch.setattr(executor, "run_sweep", lambda sweep, n, say: handed.append(sweep))  # trains nothing
    with pytest.raises(ConfigError, match="fedbabu-cpu-lg_fedavg-s0 starts from fedbabu-cpu-fedavg-s0"):
        execute(planned, max_concurrent=2, name="fedbabu-cpu")
    assert [[cfg.name for cfg in sweep.configs] for sweep in handed] == [["fedbabu-cpu-fedavg-s0",
                                                                          "fedbabu-cpu-fedavg-s1"]]


@pytest.mark.slow
def test_a_tiny_chain_end_to_end_fedavg_then_lg_fedavg_from_its_model(tmp_path, data_root):
    fedavg, lg = _plan(tmp_path, data_root, seeds=1)
    said = []
    execute([fedavg, lg], say=said.append)
    assert (fedavg.folder / "model.npz").exists() and (lg.folder / "summary.json").exists()
    stored = yaml.safe_load((lg.folder / "config.yaml").read_text())
    assert stored["model"]["init_from"] == str(fedavg.folder)
    # LG-FedAvg's round-0 model is FedAvg's final one, every key (the body each client keeps, the head it shares).
    model = load_inputs(lg.config).model
    start = model.layouts["full"].arrays(model.initial["full"])
    with np.load(fedavg.folder / "model.npz") as saved:
        assert sorted(saved.files) == sorted(start) and all(np.array_equal(saved[k], start[k]) for k in saved.files)
    lg_summary = json.loads((lg.folder / "summary.json").read_text())

    # Resumable: both finished, both skipped.
    said.clear()
    execute([fedavg, lg], say=said.append)
    assert said == [f"[1/2] {fedavg.config.name}: finished, skipped", f"[2/2] {lg.config.name}: finished, skipped"]

    # Kept, and put back on a machine without the run folders (files' times kept): still finished, still skipped.
    kept = tmp_path / "kept"
    execute([fedavg, lg], say=lambda line: None, kept=kept)
    with tarfile.open(kept / f"{fedavg.config.name}.tar.gz") as needed, \
            tarfile.open(kept / f"{lg.config.name}.tar.gz") as dependant:
        assert "model.npz" in needed.getnames() and "model.npz" not in dependant.getnames()
    shutil.rmtree(fedavg.folder), shutil.rmtree(lg.folder)
    assert restore_kept([fedavg, lg], kept) == 2
    said.clear()
    execute([fedavg, lg], say=said.append)
    assert said == [f"[1/2] {fedavg.config.name}: finished, skipped", f"[2/2] {lg.config.name}: finished, skipped"]

    # FedAvg ran again (a newer model.npz): LG-FedAvg's start is stale, so it runs again from the new model.
    later = (lg.folder / "summary.json").stat().st_mtime + 10
    os.utime(fedavg.folder / "model.npz", (later, later))
    said.clear()
    execute([fedavg, lg], say=said.append)
    assert said[0].endswith("finished, skipped")
    assert said[1] == f"[2/2] {lg.config.name}: {fedavg.config.name} ran again since this run started from its " \
                      "model; running it again"
    assert json.loads((lg.folder / "summary.json").read_text())["per_client_acc"] == lg_summary["per_client_acc"]
