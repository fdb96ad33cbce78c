"""Hostile and extreme input, checked in-process before Ray starts: each is one line naming the field or
file, exit code 2, and nothing is written (no run folder, no out_dir)."""
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import make_image_zip, png
from PIL import Image

from fedsim import strict_yaml
from fedsim.cli.main import main
from fedsim.config import load_tree, validate
from fedsim.data import DataError, load_dataset, to_float
from fedsim.engine import runlock
from fedsim.engine.runfolder_checks import load_run_config
from fedsim.errors import ConfigError
from fedsim.simulate import run

SYNTHETIC = {"data": {"dataset": "synthetic", "partition": "natural", "num_clients": 30},
             "model": {"name": "mlp"}, "train": {"rounds": 1}}


def expect_exit_2(capsys, argv: list[str], fragment: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fedsim: error: ") and fragment in err, err
    return err


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(f"out_dir: {tmp_path / 'runs'}\n" + text)
    return path


def synthetic_yaml(**top) -> str:
    return yaml.safe_dump({**SYNTHETIC, **top})


# (case id, YAML text after out_dir, expected fragment)
YAML_CASES = [
    ("a billion clients", "data: {dataset: synthetic, partition: natural, num_clients: 1000000000}\nmodel: {name: mlp}\n",
     "data.num_clients"),
    ("negative seed", synthetic_yaml(seed=-1), "seed: Input should be greater than or equal to 0"),
    ("seed 2^64", synthetic_yaml(seed=2**64), "seed: Input should be less than"),
    ("infinite timeout", synthetic_yaml() + "engine: {round_timeout_s: .inf}\n", "engine.round_timeout_s"),
    ("nan learning rate", "train: {body: {lr: .nan}}\n", "train.body.lr"),
    ("'no' is not 0", "engine: {checkpoint_every: no}\n", "engine.checkpoint_every"),
    ("false is not 0", "engine: {checkpoint_every: false}\n", "engine.checkpoint_every: expected a number"),
    ("1 is not true", "data: {augment: 1}\n", "data.augment: expected true or false"),
    ("'yes' is not true", "data: {augment: yes}\n", "data.augment"),
    ("true is not a learning rate", "train: {body: {lr: true}}\n", "train.body.lr"),
    ("fractional rounds", "train: {rounds: 2.5}\n", "train.rounds"),
    ("duplicate top-level key", "seed: 1\nseed: 2\n", "key 'seed' is given twice"),
    ("duplicate section", "train: {rounds: 2}\ntrain: {local_epochs: 1}\n", "key 'train' is given twice"),
    ("duplicate nested key", "train:\n  rounds: 2\n  rounds: 3\n", "key 'rounds' is given twice"),
    ("name with ..", "name: ../escape\n", "name: must be one folder name"),
    ("absolute name", "name: /tmp/escape\n", "name: must be one folder name"),
    ("name with a slash", "name: a/b\n", "name: must be one folder name"),
    ("name is ..", "name: '..'\n", "name: must be one folder name"),
    ("name with a space", "name: my run\n", "name: must be one folder name"),
    ("empty name", "name: ''\n", "name: must be one folder name"),
    ("name as a number", "name: 5\n", "name: Input should be a valid string"),
]


@pytest.mark.parametrize("case,text,fragment", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_hostile_config(case, text, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path-like name would land here
    expect_exit_2(capsys, ["run", str(write_config(tmp_path, text)), "--overwrite"], fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]


def test_alias_bomb_is_refused_without_echoing_it(tmp_path, capsys):
    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        levels.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    text = "data:\n  options:\n" + "".join(f"    {line}\n" for line in levels)
    err = expect_exit_2(capsys, ["run", str(write_config(tmp_path, text))], "anchors and aliases")
    assert "lol" not in err and len(err) < 300


def test_a_huge_document_is_refused_before_parsing(tmp_path, capsys):
    text = "tags: [" + ", ".join(["x"] * 600_000) + "]\n"
    err = expect_exit_2(capsys, ["run", str(write_config(tmp_path, text))], "larger than 1 MiB")
    assert len(err) < 300


def test_override_values_follow_the_same_rules(tmp_path, capsys):
    cfg = write_config(tmp_path, synthetic_yaml())
    expect_exit_2(capsys, ["run", str(cfg), "engine.checkpoint_every=no"], "engine.checkpoint_every")
    expect_exit_2(capsys, ["run", str(cfg), "name=../../etc"], "name: must be one folder name")


def test_validation_error_echoes_at_most_a_short_excerpt():
    with pytest.raises(ConfigError) as info:
        validate({"train": {"rounds": ["x" * 10_000] * 1000}})
    assert len(str(info.value)) < 300


def test_yaml_12_scalars():
    assert strict_yaml.load("a: no\nb: on\nc: 010\nd: 1e-3\ne: 1:30\nf: 0x1f\ng: True") == {
        "a": "no", "b": "on", "c": 10, "d": 0.001, "e": "1:30", "f": 31, "g": True}


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000, "".join(" " * i + "a:\n" for i in range(1200))])
def test_a_document_nested_past_any_config_is_one_line(text):
    with pytest.raises(strict_yaml.YamlError, match="nesting depth|nested too deeply"):
        strict_yaml.load(text)


def test_sweep_names_stay_safe_folder_names(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SYNTHETIC, "sweep": {"model.client": ["pkg.mod:Class", "a b/c"]}}))
    from fedsim.sweep.expand import expand_sweep

    tree = load_tree(path)
    del tree["sweep"]["model.client"][1]  # validation itself is not the point: the generated name is
    names = [c.name for c in expand_sweep(tree)]
    assert names == ["s-pkg.mod_Class"]


# -- run folders: locked while live, resume refuses changed data and settings ----------------------------


def test_a_live_run_folder_is_refused_and_left_alone(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "busy"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"round": 1}\n')
    cfg = write_config(tmp_path, synthetic_yaml(name="busy"))
    with runlock.hold(run_dir):
        expect_exit_2(capsys, ["run", str(cfg), "--overwrite"], "in use by a live run")
        expect_exit_2(capsys, ["run", str(cfg)], "in use by a live run")
        with pytest.raises(ConfigError, match="in use"):
            with runlock.hold(run_dir):
                pass
    assert (run_dir / "metrics.jsonl").read_text() == '{"round": 1}\n'
    with runlock.hold(run_dir):  # released when the holder ends
        pass


def _started_run(tmp_path: Path, data: dict) -> Path:
    """A run folder as `fedsim run` leaves it after starting (config, partition, data digest), without Ray."""
    from fedsim.engine.runfolder import RunFolder
    from fedsim.plan.build import load_inputs

    cfg = validate({**SYNTHETIC, "name": "r", "out_dir": str(tmp_path / "runs"), "data": data})
    inputs = load_inputs(cfg)
    RunFolder(cfg).create(inputs.partition, inputs.data)
    return tmp_path / "runs" / "r"


def test_resume_refuses_changed_settings_but_accepts_rounds_and_logging(tmp_path):
    run_dir = _started_run(tmp_path, SYNTHETIC["data"])
    for override, key in (("seed=3", "seed"), ("train.batch_size=7", "train.batch_size"),
                          ("engine.threads_per_worker=2", "engine.threads_per_worker")):
        with pytest.raises(ConfigError, match=f"^{key}: a resumed run cannot change it"):
            load_run_config(run_dir, [override])
    cfg = load_run_config(run_dir, ["train.rounds=20", "logging.wandb.run_id=abc123", "engine.workers=1"])
    assert (cfg.train.rounds, cfg.logging.wandb.run_id) == (20, "abc123")


def test_resume_refuses_a_dataset_whose_content_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "imgs.zip"
    make_image_zip(root, seed=0)
    run_dir = _started_run(tmp_path, {"dataset": "imagefolder", "root": str(root), "partition": "iid",
                                      "num_clients": 2, "augment": False})
    make_image_zip(root, seed=1)  # same files, same counts, other pixels
    cfg = load_run_config(run_dir)
    with pytest.raises(DataError, match="data changed since this run started"):
        run(cfg, resume=True)


# -- hostile data ---------------------------------------------------------------------------------


def imagefolder_yaml(root: Path) -> str:
    return yaml.safe_dump({"data": {"dataset": "imagefolder", "root": str(root), "partition": "iid",
                                    "num_clients": 2}, "model": {"name": "cnn4"}})


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_macos_metadata_in_a_zip_is_skipped(tmp_path, cache):
    zpath = tmp_path / "d.zip"
    make_image_zip(zpath, extra={"__MACOSX/train/cat/._0.png": b"\x00\x05\x16\x07 AppleDouble",
                                 "train/cat/._1.png": b"\x00\x05\x16\x07 AppleDouble"})
    data = load_dataset("imagefolder", zpath)
    assert (len(data.train_y), len(data.test_y), data.classes) == (6, 6, ("cat", "dog"))


def test_decompression_bomb_is_one_line_exit_2(tmp_path, cache, capsys, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)  # an 8x8 image counts as a bomb (> 2 x 20 pixels)
    zpath = tmp_path / "d.zip"
    make_image_zip(zpath)
    expect_exit_2(capsys, ["run", str(write_config(tmp_path, imagefolder_yaml(zpath)))], "too large to decode")
    assert not (tmp_path / "runs").exists()


# (case id, zip members, expected fragment)
BROKEN_ZIPS = [
    ("no test split", {"train/cat/0.png": "img"}, "needs train/<class>/ and test/<class>/"),
    ("classes differ", {"train/cat/0.png": "img", "test/dog/0.png": "img"}, "differing"),
    ("sizes differ", {"train/cat/0.png": "img", "test/cat/0.png": "big"}, "resize all images"),
    ("not an image", {"train/cat/0.png": "img", "test/cat/0.png": b"GIF89a broken"}, "cannot decode"),
    ("empty zip", {}, "needs train/<class>/ and test/<class>/"),
    ("only macOS metadata", {"__MACOSX/train/cat/._0.png": b"x", "__MACOSX/test/cat/._0.png": b"x"}, "needs train/"),
]


@pytest.mark.parametrize("case,members,fragment", BROKEN_ZIPS, ids=[c[0] for c in BROKEN_ZIPS])
def test_broken_image_zip(case, members, fragment, tmp_path, cache, capsys):
    images = {"img": png(np.zeros((8, 8, 3), np.uint8)), "big": png(np.zeros((9, 8, 3), np.uint8))}
    zpath = tmp_path / "d.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for name, data in members.items():
            z.writestr(name, images.get(data, data))
    expect_exit_2(capsys, ["run", str(write_config(tmp_path, imagefolder_yaml(zpath)))], fragment)
    assert not (tmp_path / "runs").exists()


def test_image_folder_with_hidden_and_broken_files(tmp_path, cache, capsys):
    root = tmp_path / "folder"
    for split in ("train", "test"):
        (root / split / "cat").mkdir(parents=True)
        (root / split / "cat" / "0.png").write_bytes(png(np.full((8, 8, 3), 7, np.uint8)))
        (root / split / "cat" / "._0.png").write_bytes(b"AppleDouble")  # skipped
    assert len(load_dataset("imagefolder", root).train_y) == 1
    (root / "test" / "cat" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    expect_exit_2(capsys, ["run", str(write_config(tmp_path, imagefolder_yaml(root)))], "1.png")


def test_constant_colour_channel_gives_finite_inputs(tmp_path, cache):
    zpath = tmp_path / "d.zip"
    make_image_zip(zpath, blue=0)
    data = load_dataset("imagefolder", zpath)
    assert data.std[2] > 0
    assert np.isfinite(to_float(data.train_x[:4], data.mean, data.std).numpy()).all()


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def cifar_batches(folder: Path, poison: str | None = None) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3],
                 "filenames": [b"a.png"] * 4}
        if name == poison:
            batch["data"] = _RunsCode()
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [str(c) for c in range(10)]}, protocol=2))


def test_cifar_python_batches_load_arrays_only(tmp_path, cache, monkeypatch):
    cifar_batches(tmp_path / "cifar-10-batches-py")
    assert load_dataset("cifar10", tmp_path).train_x.shape == (20, 32, 32, 3)
    (tmp_path / "evil").mkdir()
    cifar_batches(tmp_path / "evil" / "cifar-10-batches-py", poison="data_batch_3")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"refusing to load (posix|os|nt)\.system"):
        load_dataset("cifar10", tmp_path / "evil")
    assert not (tmp_path / "pwned").exists()
