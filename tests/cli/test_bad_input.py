"""Malformed inputs: each is one line naming the field or file and the fix, exit code 2, no traceback,
and an existing run folder is left exactly as it was."""
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import cli_env

from fedsim.cli.main import main

GOOD = {
    "name": "victim", "seed": 0, "algorithm": "fedper",
    "data": {"dataset": "cifar10", "num_clients": 4, "partition": "classes", "k": 3,
             "train_fraction": 0.01, "test_fraction": 0.01},
    "model": {"name": "cnn4", "personal_layers": 1},
    "train": {"rounds": 1, "local_epochs": 1},
    "eval": {"finetune_epochs": 0},
}

# (case id, dotted override applied to GOOD, expected fragment of the message)
CONFIG_CASES = [
    ("unknown top-level key", {"trian": {}}, "trian: Extra inputs are not permitted (got {}); did you mean train?"),
    ("unknown nested key", {"train.lrr": 0.1}, "train.lrr: Extra inputs"),
    ("misspelt nested key", {"train.round": 3}, "train.round: Extra inputs are not permitted (got 3); did you mean "
     "rounds?"),
    ("misspelt method parameter", {"algorithm": {"name": "fedprox", "muu": 0.1}}, "did you mean mu?"),
    ("wrong type", {"train.rounds": "ten"}, "train.rounds"),
    ("zero rounds", {"train.rounds": 0}, "train.rounds"),
    ("f = 0", {"train.fraction": 0}, "train.fraction"),
    ("f > 1", {"train.fraction": 1.5}, "train.fraction"),
    ("K_P above depth", {"model.personal_layers": 9}, "model.personal_layers: 9 is outside 0..5"),
    ("K_P negative", {"model.personal_layers": -1}, "model.personal_layers"),
    ("k above classes", {"data.k": 11}, "data.partition.k"),
    ("k zero", {"data.k": 0}, "data.partition.k"),
    ("negative lr", {"train.body.lr": -0.1}, "train.body.lr"),
    ("momentum 1", {"train.head.momentum": 1.0}, "train.head.momentum"),
    ("zero clients", {"data.num_clients": 0}, "data.num_clients"),
    ("too many clients", {"data.num_clients": 100000}, "data.num_clients"),
    ("unknown algorithm", {"algorithm": "fedfoo"}, "unknown algorithm 'fedfoo'"),
    ("unknown model", {"model.name": "vgg"}, "model.name"),
    ("sizes for a model without any", {"model.options": {"hidden": 16}}, "model.options: cnn4 takes no options"),
    ("perfedavg alpha 0", {"algorithm": {"name": "perfedavg", "alpha": 0}}, "perfedavg: algorithm.alpha"),
    ("pfedme beta above 1", {"algorithm": {"name": "pfedme", "beta": 2}}, "pfedme: algorithm.beta"),
    ("trim fraction 0.5", {"server.aggregator": "trimmed_mean", "server.trim_fraction": 0.5}, "server.trim_fraction"),
    ("krum short of clients", {"server.aggregator": "krum", "algorithm": "fedavg"}, "server.byzantine: krum with f=1"),
    ("robust rule for a replies method", {"server.aggregator": "median", "algorithm": "fedamp"}, "server.aggregator: "
     "fedamp combines"),
    ("unknown dataset", {"data.dataset": "mnist"}, "mnist"),
    ("missing data root", {"data.root": "/nonexistent/data"}, "data.root"),
    ("unknown partition", {"data.partition": "weird"}, "data.partition"),
    ("shards without s", {"data.partition": "shards"}, "data.partition.shards_per_client"),
    ("dirichlet without beta", {"data.partition": "dirichlet"}, "data.partition.beta"),
    ("negative beta", {"data.partition": "dirichlet", "data.beta": -1}, "data.partition.beta"),
    ("conflicting agreed 1", {"data.partition": {"name": "conflicting", "agreed": 1}}, "data.partition.agreed"),
    ("conflicting agreed below 0", {"data.partition": {"name": "conflicting", "agreed": -0.5}},
     "data.partition.agreed"),
    ("conflicting agreed leaves one class to permute", {"data.partition": {"name": "conflicting", "agreed": 0.9}},
     "data.partition.agreed"),
    ("zero train fraction", {"data.train_fraction": 0}, "data.train_fraction"),
    ("zero workers", {"engine.workers": 0}, "engine.workers"),
    ("gpu fraction above 1", {"engine.gpus_per_worker": 2}, "engine.gpus_per_worker"),
    ("zero batch", {"train.batch_size": 0}, "train.batch_size"),
    ("bad finetune part", {"eval.finetune_part": "tail"}, "eval.finetune_part"),
    ("bad wandb mode", {"logging.wandb.mode": "sometimes"}, "logging.wandb.mode"),
    ("natural partition on cifar10", {"data.partition": "natural"}, "data.partition"),
    ("bad sweep value", {"sweep": {"algorithm": ["fedavg", "nope"]}}, "unknown algorithm 'nope'"),
    ("bad dataset option", {"data.dataset": "synthetic", "data.options": {"alpah": 1}}, "data.options"),
    ("negative checkpoint interval", {"engine.checkpoint_every": -1}, "engine.checkpoint_every"),
    ("pack of zero clients", {"engine.pack": 0}, "engine.pack: 0 is not a pack size"),
    ("pack size as a word", {"engine.pack": "many"}, "engine.pack"),
    ("packing on two CPU threads", {"engine.pack": "auto", "engine.threads_per_worker": 2},
     "engine.pack: packed training on a CPU needs engine.threads_per_worker: 1"),
    ("nonfinite policy", {"train.on_nonfinite": "ignore"}, "train.on_nonfinite"),
    ("fedrod head lr scale 0", {"algorithm": {"name": "fedrod", "head_lr_scale": 0}}, "fedrod: algorithm.head_lr_scale"),
    ("fedproto negative lambda", {"algorithm": {"name": "fedproto", "lambda": -1}}, "fedproto: algorithm.lambda"),
    ("ifca more clusters than clients", {"algorithm": {"name": "ifca", "clusters": 5}}, "ifca: algorithm.clusters"),
    ("fedfomo epsilon above 1", {"algorithm": {"name": "fedfomo", "epsilon": 1.5}}, "fedfomo: algorithm.epsilon"),
    ("fedala sample above 100%", {"algorithm": {"name": "fedala", "rand_percent": 120}},
     "fedala: algorithm.rand_percent"),
    ("fedala more layers than the model", {"algorithm": {"name": "fedala", "layer_idx": 50}},
     "fedala: algorithm.layer_idx"),
    ("fedamp sigma 0", {"algorithm": {"name": "fedamp", "sigma": 0}}, "fedamp: algorithm.sigma"),
]


def _set(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        h.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def victim(tmp_path):
    """An existing run folder every bad input must leave untouched, even with --overwrite."""
    folder = tmp_path / "runs" / "victim"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"round": 1, "client": 0, "acc": 0.5}\n')
    (folder / "config.yaml").write_text("name: victim\n")
    return folder


def _expect_clean_error(capsys, argv, fragment):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fedsim: error: ") and fragment in err, err


@pytest.mark.parametrize("case,override,fragment", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config(case, override, fragment, tmp_path, victim, data_root, capsys):
    tree = yaml.safe_load(yaml.safe_dump(GOOD))
    tree["out_dir"] = str(victim.parent)
    tree["data"]["root"] = str(data_root)
    for dotted, value in override.items():
        _set(tree, dotted, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(tree))
    before = _digest(victim)
    _expect_clean_error(capsys, ["run", str(path), "--overwrite"], fragment)
    assert _digest(victim) == before


@pytest.mark.parametrize("override, fragment", [
    ({"train": {**GOOD["train"], "rounds": 0}}, "train.rounds"),
    ({"model": {"client": "nosuch_module:Thing"}}, "model.client: cannot import 'nosuch_module:Thing' (No module named "
                                                  "'nosuch_module')"),
    ({"model": {"client": "user_plugins:TwoPartModule", "callbacks": ["nosuch.pkg:Hook"]}},
     "model.callbacks[0]: cannot import 'nosuch.pkg:Hook'"),
], ids=["bad setting", "missing module", "missing callback package"])
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["run", "dry run"])
def test_a_bad_config_is_refused_before_torch_or_ray_is_imported(tmp_path, override, fragment, dry_run):
    """A typo is answered in well under a second: the ~5 s of torch and Ray imports come after validation, and after
    a look for each plug-in's top-level module (which runs none of its code)."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **override}))
    code = ("import sys\nfrom fedsim.cli.main import main\n"
            f"code = main(['run', {str(path)!r}, '--overwrite', *{dry_run!r}])\n"
            "print(code, [m for m in ('torch', 'ray') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=cli_env())
    assert out.stdout.strip() == "2 []" and fragment in out.stderr, out.stdout + out.stderr


def test_missing_config_file(capsys, tmp_path):
    _expect_clean_error(capsys, ["run", str(tmp_path / "nope.yaml")], "config file not found")


def test_config_not_yaml(capsys, tmp_path):
    (tmp_path / "x.yaml").write_text("data: [unclosed\n")
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml")], "not valid YAML")


def test_config_not_a_mapping(capsys, tmp_path):
    (tmp_path / "x.yaml").write_text("- a\n- b\n")
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml")], "top level must be a mapping")


def test_override_without_equals(capsys, tmp_path):
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(GOOD))
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml"), "train.rounds"], "expected key=value")


def test_override_into_a_scalar(capsys, tmp_path):
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(GOOD))
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml"), "seed.x=1"], "seed: Input should be a valid integer")


def test_corrupt_data_zip(capsys, tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    (root / "cifar10-jpeg.zip").write_bytes(b"PK\x03\x04 not really a zip")
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    tree = {**GOOD, "out_dir": str(tmp_path / "runs"), "data": {**GOOD["data"], "root": str(root)}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(tree))
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml")], "cifar10-jpeg.zip")


def test_zip_with_undecodable_image(capsys, tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    with zipfile.ZipFile(root / "cifar10-jpeg.zip", "w") as z:
        for split in ("train", "test"):
            z.writestr(f"{split}/airplane/0000.jpg", b"not a jpeg")
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    tree = {**GOOD, "out_dir": str(tmp_path / "runs"), "data": {**GOOD["data"], "root": str(root)}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(tree))
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml")], "cifar10-jpeg.zip")


def test_resume_a_folder_that_is_not_a_run(capsys, tmp_path):
    _expect_clean_error(capsys, ["run", "--resume", str(tmp_path)], "not a run folder")


def test_neither_config_nor_resume(capsys):
    _expect_clean_error(capsys, ["run"], "give a CONFIG.yaml")


def test_gpus_requested_but_none_exist(tmp_path, data_root, local_ray, capsys):
    """Ray would wait forever for a GPU that is not there; fedsim says so instead, before any folder is made."""
    tree = {**GOOD, "out_dir": str(tmp_path / "runs"), "data": {**GOOD["data"], "root": str(data_root)},
            "engine": {"workers": 2, "gpus_per_worker": 0.5}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(tree))
    _expect_clean_error(capsys, ["run", str(tmp_path / "x.yaml")],
                        "engine.gpus_per_worker: 2 workers x 0.5 need 1 GPU, the Ray cluster has 0")
    assert not (tmp_path / "runs" / "victim").exists()


@pytest.mark.parametrize("text, fragment", [("", "the file is empty"), ("# only a comment\n", "the file is empty"),
                                            ("name: x\nout_dir: runs\n", "sets none of algorithm, data, eval")])
def test_a_config_that_describes_no_run_is_refused_before_any_work(tmp_path, capsys, text, fragment):
    config = tmp_path / "blank.yaml"
    config.write_text(text)
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and not (tmp_path / "runs").exists()


def test_version_names_the_installed_fedsim(capsys):
    import fedsim

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"fedsim {fedsim.__version__}"
