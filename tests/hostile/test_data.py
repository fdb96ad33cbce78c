"""Hostile data files: a data set file that is damaged, of the wrong shape or kind, or holds values no image has.
Each probe runs `fedsim run` in-process: one line naming the file under data.root and the fix, exit code 2, no run
folder, and no cache published from it. (Broken and hostile image folders, zips and CIFAR batches:
tests/cli/test_hostile_input.py.)"""
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedsim.cli.main import main

FEMNIST = "femnist-leaf-sample.npz"


def femnist_arrays(n: int = 12) -> dict[str, np.ndarray]:
    """A FEMNIST npz as LEAF's sample holds it (28x28 8-bit images, labels 0..61, writer ids)."""
    rng = np.random.default_rng(0)
    return {**{f"{s}_x": rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for s in ("train", "test")},
            **{f"{s}_y": rng.integers(0, 62, n) for s in ("train", "test")},
            **{f"{s}_writer": rng.integers(0, 3, n) for s in ("train", "test")}}


def changed(**arrays) -> dict[str, np.ndarray]:
    return {**femnist_arrays(), **arrays}


def without(key: str) -> dict[str, np.ndarray]:
    arrays = femnist_arrays()
    del arrays[key]
    return arrays


def with_nan() -> dict[str, np.ndarray]:
    x = femnist_arrays()["train_x"].astype(np.float32)
    x[0, 0, 0] = np.nan
    return changed(train_x=x)


# (case id, the npz's arrays or raw bytes, fragment of the one line)
FILES = [
    ("not an npz at all", b"\0garbage" * 64, "is not a FEMNIST npz"),
    ("a pickled object array", changed(train_x=np.array([{"a": 1}] * 12, dtype=object)), "is not a FEMNIST npz"),
    ("an array missing", without("test_writer"), "is not a FEMNIST npz"),
    ("fewer images than labels", changed(train_x=femnist_arrays()["train_x"][:5]), "holds 5 train images but 12 labels"),
    ("flat images", changed(test_x=femnist_arrays()["test_x"].reshape(12, -1)), "not 8-bit pixels"),
    ("float features with a NaN", with_nan(), "holds float32 images"),
    ("labels past the classes", changed(train_y=femnist_arrays()["train_y"] + 62), "not class indices 0..61"),
    ("negative labels", changed(test_y=-1 - femnist_arrays()["test_y"]), "test labels that are not class indices"),
]


@pytest.mark.parametrize("case,content,fragment", FILES, ids=[c[0] for c in FILES])
def test_a_damaged_data_file_is_one_line_naming_it(case, content, fragment, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FEDSIM_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "data"
    root.mkdir()
    if isinstance(content, bytes):
        (root / FEMNIST).write_bytes(content)
    else:
        np.savez(root / FEMNIST, **content)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({
        "name": "probe", "out_dir": str(tmp_path / "runs"), "algorithm": "fedavg",
        "data": {"dataset": "femnist", "root": str(root), "partition": "iid", "num_clients": 2},
        "model": {"name": "mlp"}, "train": {"rounds": 1}, "eval": {"finetune_epochs": 0}}))
    code = main(["run", str(config)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"fedsim: error: data.root: {root / FEMNIST}"), err
    assert fragment in err, err
    assert not (tmp_path / "runs").exists()
    assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.startswith(".")]  # nothing published


def test_an_intact_file_of_the_same_shape_loads(tmp_path, monkeypatch):
    """The probes above differ from a file fedsim takes only in what they break."""
    from fedsim.data import load_dataset

    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    np.savez(tmp_path / FEMNIST, **femnist_arrays())
    data = load_dataset("femnist", Path(tmp_path))
    assert data.train_x.shape == (12, 28, 28, 1) and data.num_classes == 62
