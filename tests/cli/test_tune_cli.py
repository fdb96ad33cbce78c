"""`fedsim tune` on the command line: the dry run's count of runs and budget; bad input refused in one line, exit 2,
before anything is written."""
import pytest

from conftest import synthetic_tree, tune_tree, write_yaml
from fedsim.cli.main import main


@pytest.mark.parametrize("over, message", [
    ({"data": {"validation": 0.0}}, "data.validation: fedsim tune chooses each method's settings on the validation "
                                    "split, and this config has none; set data.validation"),
    ({"tune": {"methods": ["fedavg", "fedavg"]}}, "tune.methods: fedavg is listed twice"),
    ({"tune": {"methods": []}}, "tune.methods"),
    ({"tune": {"seeds": [1, 1]}}, "tune.seeds: give distinct seeds"),
    ({"tune": {"space": {"lrr": {"choice": [0.1]}}}}, "tune.space.lrr"),
    ({"sweep": {"seed": [1, 2]}}, "sweep: fedsim tune draws its own runs"),
])
def test_bad_tuning_configs_are_one_line_exit_2_before_anything_runs(tmp_path, capsys, over, message):
    tree = tune_tree(tmp_path)
    for section, value in over.items():
        tree[section] = {**tree.get(section, {}), **value} if isinstance(value, dict) else value
    assert main(["tune", str(write_yaml(tmp_path / "bad.yaml", tree))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "_sweeps").exists() and not (tmp_path / "tune").exists()


def test_a_config_without_a_tune_section_is_refused(tmp_path, capsys):
    assert main(["tune", str(write_yaml(tmp_path / "plain.yaml", synthetic_tree(tmp_path)))]) == 2
    assert "tune: this config has no tune section" in capsys.readouterr().err


def test_dry_run_prints_the_count_of_runs_and_the_budget(tmp_path, capsys):
    assert main(["tune", str(write_yaml(tmp_path / "t.yaml", tune_tree(tmp_path))), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "24 runs: 18 search + 6 final (3 methods)"  # 3 methods x 3 trials x 2 seeds; 3 x 2 final
    assert out[1] == ("budget: 3 trials x 2 seed(s) (0, 1) x 1 rounds per method; the chosen settings at 2 seeds "
                      "(0..1)")
    assert out[2] == "search runs finished: 0 of 18 (a rerun trains only the rest)"
    assert out[4].startswith("fedprox: lr loguniform [0.01, 0.1]; momentum choice [0.0, 0.9]; algorithm.mu choice")
    assert not (tmp_path / "_sweeps").exists()
