"""Hostile plug-in strings (issue 47, items 4, 6 and 7): only a plug-in string the command line gives a field counts
as the user's on resume; a string naming another library's function, ``__main__`` or a callable of the wrong kind
or signature is one line naming the field and what it takes, at validation (``--dry-run`` too) and before the run
folder; a TypeError inside the user's own plug-in is one line naming it, exit 2. No Ray is started here."""
import pytest
from conftest import synthetic_tree, write_yaml

from fedsim.cli.main import main
from fedsim.plugins import plugin_settings

PARTITION_TAKES = "a function f(train_y, test_y, num_clients, rng) returning (train index arrays, test index arrays)"
DATASET_TAKES = "a function f(root, options) returning a fedsim.data.ArrayDataset"


def _config(tmp_path, **over):
    return str(write_yaml(tmp_path / "p.yaml", synthetic_tree(tmp_path / "runs", "p", **over)))


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# -- item 4: a folder's plug-in is imported only when the command line gives that field that string -------------
def _folder_naming_code(tmp_path, monkeypatch, section: str):
    (tmp_path / "marker_mod.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                                            "class Method:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "runs" / "shared"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"name: shared\n{section}\n")
    return run


@pytest.mark.parametrize("section, override, field", [
    ("algorithm: {name: 'marker_mod:Method'}", "algorithm={}", "algorithm.name"),
    ("algorithm: 'marker_mod:Method'", "algorithm={mu: 0.1}", "algorithm.name"),
    ("algorithm: fedavg\ndata: {dataset: 'marker_mod:Method'}", "data={}", "data.dataset"),
    ("algorithm: fedavg\ndata: {partition: {name: 'marker_mod:Method'}}", "data.partition={}", "data.partition.name"),
    ("algorithm: fedavg\nmodel: {callbacks: ['marker_mod:Method']}", "model={}", "model.callbacks[0]"),
])
def test_a_command_line_key_above_the_plugin_field_does_not_trust_the_folder(tmp_path, monkeypatch, capsys,
                                                                              section, override, field):
    run = _folder_naming_code(tmp_path, monkeypatch, section)
    err = _one_line_exit_2(capsys, ["run", "--resume", str(run), override, "--dry-run"])
    assert err.startswith(f"fedsim: error: {field}: ") and "--trust-plugins" in err, err
    assert not (tmp_path / "ran").exists()  # the folder's module was never imported


def test_a_field_is_one_field_whichever_form_names_it():
    assert plugin_settings({"algorithm": "a:B"}) == plugin_settings({"algorithm": {"name": "a:B"}}) == {
        "algorithm.name": "a:B"}
    assert plugin_settings({"data": {"partition": "a:f"}}) == {"data.partition.name": "a:f"}


# -- item 7 and item 6's callbacks: the wrong kind of object is one line before anything is written -------------
@pytest.mark.parametrize("override, field, takes", [
    ("data.partition=numpy:load", "data.partition", PARTITION_TAKES),
    ("data.partition=yaml:load", "data.partition", PARTITION_TAKES),
    ("data.partition=ray:init", "data.partition", PARTITION_TAKES),
    ("data.partition=__main__:main", "data.partition", PARTITION_TAKES),
    ("data.dataset=numpy:load", "data.dataset", DATASET_TAKES),
    ("model.callbacks=[numpy:load]", "model.callbacks", "a class subclassing pytorch_lightning.Callback"),
    ("model.callbacks=[user_plugins:tiny_net]", "model.callbacks", "a class subclassing pytorch_lightning.Callback"),
    ("data.partition=user_plugins:blobs", "data.partition", PARTITION_TAKES),
    ("model.name=user_plugins:round_robin", "model.name", "a function f(num_classes=, in_channels=, image_size=)"),
])
def test_a_plugin_of_the_wrong_kind_is_one_line_on_a_dry_run(tmp_path, capsys, override, field, takes):
    err = _one_line_exit_2(capsys, ["run", _config(tmp_path), override, "--dry-run"])
    assert err.startswith(f"fedsim: error: {field}: ") and takes in err, err
    assert not (tmp_path / "runs").exists()


def test_callback_init_args_it_does_not_take_are_one_line_on_a_dry_run(tmp_path, capsys):
    spec = "model.callbacks=[{class_path: user_plugins:ListedCallback, init_args: {colour: red}}]"
    err = _one_line_exit_2(capsys, ["run", _config(tmp_path), spec, "--dry-run"])
    assert err.startswith("fedsim: error: model.callbacks: user_plugins:ListedCallback cannot be made with init_args"), err
    assert not (tmp_path / "runs").exists()


def test_a_wrong_callback_is_refused_before_ray_or_the_run_folder(tmp_path, monkeypatch, capsys):
    def ray_starts(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr("fedsim.engine.ray_cluster.connect_ray", ray_starts)
    err = _one_line_exit_2(capsys, ["run", _config(tmp_path), "model.callbacks=[numpy:load]"])
    assert "model.callbacks: 'numpy:load'" in err
    assert not (tmp_path / "runs").exists()


USER_CODE_RAISING = """
def split(train_y, test_y, num_clients, rng):
    return sorted([1, "a"])


def data(root, options):
    return len(root)  # no data.root: None
"""


@pytest.mark.parametrize("override, field, call", [
    ("data.partition=raising_mod:split", "data.partition", "f(train_y, test_y, num_clients, rng)"),
    ("data.dataset=raising_mod:data", "data.dataset", "f(root, options)"),
])
def test_a_type_error_inside_the_users_plugin_is_one_line_naming_it(tmp_path, monkeypatch, capsys, override, field,
                                                                     call):
    (tmp_path / "raising_mod.py").write_text(USER_CODE_RAISING)
    monkeypatch.syspath_prepend(str(tmp_path))
    err = _one_line_exit_2(capsys, ["run", _config(tmp_path), override, "--dry-run"])
    spec = override.split("=")[1]
    assert err.startswith(f"fedsim: error: {field}: '{spec}' failed when called as {call} (TypeError: "), err
