"""A user's algorithm, model, data set and partition, each named in a config as ``module:name``."""
import numpy as np
import pytest
from conftest import TESTS, in_process_server, train_one

from fedsim.algorithms import WEIGHTS
from fedsim.config import validate
from fedsim.data import DataError, load_dataset, make_partition
from fedsim.engine.runfolder import RunFolder
from fedsim.errors import ConfigError
from fedsim.plan.build import load_inputs


def _config(tmp_path, **over):
    tree = {"name": "plug", "seed": 2, "out_dir": str(tmp_path), "algorithm": "user_plugins:HalfStep",
            "data": {"dataset": "user_plugins:blobs", "partition": "user_plugins:round_robin", "num_clients": 4,
                     "augment": False},
            "model": {"name": "user_plugins:tiny_net"},
            "train": {"rounds": 2, "local_epochs": 1, "batch_size": 20, "eval_every": 1},
            "eval": {"finetune_epochs": 0}, "engine": {"workers": 2}}
    tree.update(over)
    return validate(tree)


def test_a_users_algorithm_model_dataset_and_partition_run_unchanged_fedsim(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    inputs = load_inputs(cfg)  # validation path of `fedsim run`
    assert inputs.data.name == "blobs" and [len(t) for t in inputs.partition.train] == [100] * 4
    assert inputs.partition.train[1][:3].tolist() == [1, 5, 9]  # the user's round-robin split
    server = in_process_server(cfg)
    server.restore(None)
    before = server.state[WEIGHTS].copy()
    result = server.round(1)
    assert [r["client"] for r in result.records] == [0, 1, 2, 3] and all(0 <= r["acc"] <= 1 for r in result.records)
    # HalfStep's own server hook: the new global is halfway between the old one and the average.
    runtime = server.pool.workers[0].runtime  # HalfStep keeps nothing per client: any worker trains any client
    average = np.mean([train_one(runtime, {WEIGHTS: before}, c, 1)[0][WEIGHTS] for c in result.sampled], axis=0)
    np.testing.assert_allclose(server.state[WEIGHTS], (before + average) / 2, rtol=1e-5, atol=1e-6)


def test_plugins_that_cannot_be_imported_or_are_the_wrong_kind_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.name: cannot import 'nowhere:Thing'"):
        _config(tmp_path, algorithm="nowhere:Thing")
    with pytest.raises(ConfigError, match="not a class subclassing fedsim.algorithms.Algorithm"):
        _config(tmp_path, algorithm="user_plugins:tiny_net")
    with pytest.raises(DataError, match="data.dataset: cannot import"):
        load_dataset("user_plugins:nothing")
    with pytest.raises(DataError, match="data.partition: cannot import"):
        make_partition("user_plugins:nothing", np.zeros(4, int), np.zeros(4, int), 2, 0)
    with pytest.raises(ConfigError, match="model.name"):
        load_inputs(_config(tmp_path, model={"name": "user_plugins:blobs"}))


def test_a_run_starts_from_another_runs_final_global_weights(tmp_path, monkeypatch):
    """LG-FedAvg warm-started from a FedAvg run, as the FedBABU authors' scripts do (model.init_from)."""
    fedavg = _config(tmp_path, name="avg", algorithm="fedavg")
    server = in_process_server(fedavg)
    server.restore(None)
    server.round(1)
    (tmp_path / "avg").mkdir()
    RunFolder(fedavg).save_final_model(server.plan, server.state[WEIGHTS])

    lg = _config(tmp_path, name="lg", algorithm="lg_fedavg", model={"name": "user_plugins:tiny_net",
                                                                     "init_from": str(tmp_path / "avg")})
    warm = in_process_server(lg)
    runtime = warm.pool.workers[0].runtime
    assert np.array_equal(runtime.initial("full"), server.state[WEIGHTS])  # every weight, body and head
    assert runtime.layouts["personal"].size and runtime.layouts["shared"].size  # LG: body personal, head shared
    with pytest.raises(ConfigError, match="model.init_from: cannot read"):
        load_inputs(_config(tmp_path, model={"name": "user_plugins:tiny_net", "init_from": str(tmp_path)}))
    with pytest.raises(ConfigError, match="model.init_from: weight"):
        load_inputs(_config(tmp_path, model={"name": "mlp", "init_from": str(tmp_path / "avg")}))


def test_clients_never_sampled_are_reported_as_such(tmp_path, monkeypatch):
    cfg = _config(tmp_path, train={"rounds": 2, "local_epochs": 1, "batch_size": 20, "fraction": 0.25})
    server = in_process_server(cfg)
    server.restore(None)
    result = server.round(1)
    counts = {r["client"]: r["times_sampled"] for r in result.records}
    assert counts == {c: int(c in result.sampled) for c in range(4)} and sum(counts.values()) == 1


@pytest.mark.parametrize("spec, message", [
    ("builtins:eval", "names the Python standard library"), ("os:system", "names the Python standard library"),
    ("..user_plugins:blobs", "is not 'package.module:name'"), ("user_plugins:CALLS", "is a Counter from collections"),
    ("user_plugins:np", "is a module"),
])
def test_plugin_strings_resolve_only_to_user_code(spec, message):
    from fedsim.errors import PluginError
    from fedsim.data.datasets import USER_DATASET
    from fedsim.plugins import load_plugin

    with pytest.raises(PluginError, match=f"data.dataset: .*{message}") as err:
        load_plugin(spec, "data.dataset", USER_DATASET)
    assert "\n" not in str(err.value)


def test_a_librarys_class_of_the_fields_base_is_of_its_kind():
    """A library fedsim runs on never provides a function plug-in (numpy:load takes a partition's four arguments),
    but Lightning's own callbacks are Lightning callbacks."""
    import pytorch_lightning as pl

    from fedsim.models.lightning import USER_CALLBACK
    from fedsim.plugins import load_plugin

    assert load_plugin("pytorch_lightning.callbacks:Timer", "model.callbacks", USER_CALLBACK) is pl.callbacks.Timer


def _folder_naming_code(tmp_path, monkeypatch):
    """A run folder whose config.yaml was edited to name a module that leaves a marker when imported."""
    (tmp_path / "marker_mod.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                                            "def load(root, options):\n    raise RuntimeError('never called')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "runs" / "shared"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: shared\nalgorithm: fedavg\ndata: {dataset: 'marker_mod:load'}\n")
    return run


def test_resume_never_imports_code_its_run_folder_names_unless_trusted(tmp_path, monkeypatch, capsys):
    from fedsim.cli.main import main
    from fedsim.engine.runfolder_checks import load_run_config

    run = _folder_naming_code(tmp_path, monkeypatch)
    assert main(["run", "--resume", str(run), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "data.dataset: " in err and "names code to run ('marker_mod:load')" in err and "--trust-plugins" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "ran").exists()  # nothing of it ran
    assert load_run_config(run, ["data.dataset=marker_mod:load"]).data.dataset == "marker_mod:load"  # the user's own
    assert load_run_config(run, trust_plugins=True).data.dataset == "marker_mod:load"


def test_a_client_module_from_the_standard_library_fails_before_any_work(tmp_path):
    from conftest import lightning_tree

    from fedsim.errors import ConfigError

    with pytest.raises(ConfigError, match="model.client: 'os:system' names the Python standard library"):
        load_inputs(validate(lightning_tree(tmp_path, "TwoPartModule", model__client="os:system")))


def test_the_libraries_fedsim_runs_on_are_each_refused():
    """Every dependency of pyproject.toml is in LIBRARIES by its top-level module (a new one must be added)."""
    import re
    import tomllib
    from importlib import metadata

    from fedsim.plugins import LIBRARIES

    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]
    modules_of: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), set()).add(module)
    for requirement in project["dependencies"]:
        dist = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()
        assert modules_of.get(dist, set()) & LIBRARIES, f"{dist}: none of its modules {modules_of.get(dist)} in LIBRARIES"


def test_a_worker_that_imported_other_code_than_the_driver_says_which_file(tmp_path):
    """Issue 46 item 6: each worker compares the code it imported for fedsim and the config's plug-ins with the
    driver's (RunPlan.code: their sources' digests), and refuses in one line on the first call."""
    import dataclasses

    from conftest import lightning_tree, plan_for
    from fedsim.client.worker import Worker
    from fedsim.config import validate
    from fedsim.errors import UserCodeError
    from fedsim.plugins import imported_files, other_code

    plan = plan_for(validate(lightning_tree(tmp_path, "TwoPartModule")))
    assert [name for name, _, _ in plan.code] == ["fedsim", "user_plugins"] and other_code(plan.code) is None
    assert imported_files({"model": {"client": "user_plugins:TwoPartModule"}}) == plan.code
    # The same source at another path (a job's working_dir unpacked on another node) is the same code.
    moved = tuple((name, f"/elsewhere/{name}.py", source) for name, _, source in plan.code)
    assert other_code(moved) is None
    elsewhere = dataclasses.replace(plan, code=(("user_plugins", "/old/copy/user_plugins.py", "0" * 16),))
    worker = Worker(elsewhere, dict(enumerate(plan.clients)))
    assert isinstance(worker.failure, UserCodeError) and str(worker.failure).startswith(
        "user_plugins: this worker imported ") and "the driver /old/copy/user_plugins.py" in str(worker.failure)
    with pytest.raises(UserCodeError):
        worker.device_info()


@pytest.mark.parametrize("options, message", [
    ({"dtype": "float32"}, "data.dataset: 'user_plugins:relabelled_blobs' returned train_y of dtype float32 shaped "
     "(400,); give a 1-D array of integer class indices, e.g. train_y.astype(np.int64)"),
    ({"shift": 2}, "data.dataset: 'user_plugins:relabelled_blobs' returned train_y from 2 to 5, outside 0..3 (its 4 "
     "classes); map the labels to 0..C-1 and list C names in classes"),
])
def test_a_data_set_breaking_the_data_contract_is_one_line_naming_data_dataset_never_the_module(
        tmp_path, capsys, options, message):
    """Issue 67 item 2: float labels once surfaced as the module's loss failing ('fix the module'), labels beyond
    the classes as a Dirichlet partition that could not be drawn ('raise data.partition.beta')."""
    from conftest import write_yaml

    from fedsim.cli.main import main

    tree = {"name": "contract", "out_dir": str(tmp_path), "algorithm": "fedavg",
            "data": {"dataset": "user_plugins:relabelled_blobs", "options": options, "num_clients": 4,
                     "augment": False, "partition": {"name": "dirichlet", "beta": 0.5}},
            "model": {"client": "user_plugins:TwoPartModule"}, "train": {"rounds": 1}}
    assert main(["run", str(write_yaml(tmp_path / "contract.yaml", tree)), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedsim: error: {message}"


def test_labels_of_any_integer_type_are_class_indices_held_as_int64():
    data = load_dataset("user_plugins:relabelled_blobs", options={"dtype": "int32"})
    assert data.train_y.dtype == data.test_y.dtype == np.int64 and data.train_y.max() == 3
