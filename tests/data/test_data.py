"""Tests for fedsim.data: iid/classes partitions, dataset loading and caching, transforms.

The other partition kinds are tested in test_data_partitions.py.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedsim.data import DataError, Partition, load_dataset, make_partition, random_crop_flip, resolve_root, to_float
from fedsim.data import formats

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
TRAIN_Y = np.repeat(np.arange(10), 50)  # 10 classes x 50
TEST_Y = np.repeat(np.arange(10), 10)


# --------------------------------------------------------------------------- partitions


def classes_of(y: np.ndarray, idx: np.ndarray) -> set[int]:
    return set(np.unique(y[idx]).tolist())


@pytest.mark.parametrize("num_clients,k,seed", [(7, 3, 0), (10, 1, 1), (3, 4, 2), (8, 5, 3), (4, 10, 4)])
def test_classes_partition_properties(num_clients: int, k: int, seed: int) -> None:
    p = make_partition("classes", TRAIN_Y, TEST_Y, num_clients, seed, k=k)
    assert p.num_clients == num_clients
    for train, test in zip(p.train, p.test):
        assert train.dtype == test.dtype == np.int64
        assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)  # sorted, no repeats
        assert len(classes_of(TRAIN_Y, train)) == k
        assert classes_of(TRAIN_Y, train) == classes_of(TEST_Y, test)  # tested on its own classes
    for parts, y in ((p.train, TRAIN_Y), (p.test, TEST_Y)):
        together = np.concatenate(parts)
        assert len(np.unique(together)) == len(together) == len(y)  # disjoint and complete
        assert together.min() >= 0 and together.max() < len(y)
        for c in range(10):  # each class split evenly among its holders
            counts = [np.sum(y[part] == c) for part in parts if np.any(y[part] == c)]
            assert counts and max(counts) - min(counts) <= 1


def test_partition_is_a_pure_function_of_its_seed() -> None:
    np.random.seed(1)
    random.seed(1)
    np_state, py_state = np.random.get_state(), random.getstate()
    a = make_partition("classes", TRAIN_Y, TEST_Y, 7, seed=5, k=2)
    np.random.seed(99)  # global RNG state must not matter
    b = make_partition("classes", TRAIN_Y, TEST_Y, 7, seed=5, k=2)
    c = make_partition("classes", TRAIN_Y, TEST_Y, 7, seed=6, k=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.train + a.test, b.train + b.test))
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, c.train))
    np.random.seed(1)
    make_partition("iid", TRAIN_Y, TEST_Y, 7, seed=5, train_fraction=0.5)
    assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state()[1:], np_state[1:]))
    assert random.getstate() == py_state


def test_iid_sizes() -> None:
    train_y, test_y = np.arange(103) % 10, np.arange(31) % 10
    p = make_partition("iid", train_y, test_y, 10, seed=0)
    assert sorted(len(t) for t in p.train) == [10] * 7 + [11] * 3
    assert sorted(len(t) for t in p.test) == [3] * 9 + [4]
    assert np.array_equal(np.sort(np.concatenate(p.train)), np.arange(103))


def test_fractions_keep_a_stratified_subset() -> None:
    p = make_partition("iid", TRAIN_Y, TEST_Y, 4, seed=0, train_fraction=0.1, test_fraction=0.5)
    assert np.array_equal(np.bincount(TRAIN_Y[np.concatenate(p.train)]), [5] * 10)
    assert np.array_equal(np.bincount(TEST_Y[np.concatenate(p.test)]), [5] * 10)
    q = make_partition("classes", TRAIN_Y, TEST_Y, 5, seed=0, k=2, train_fraction=0.2)
    assert np.array_equal(np.bincount(TRAIN_Y[np.concatenate(q.train)]), [10] * 10)


@pytest.mark.parametrize(
    "kind,num_clients,kwargs,field",
    [
        ("classes", 5, {"k": 11}, "data.partition.k"),
        ("classes", 5, {"k": 0}, "data.partition.k"),
        ("classes", 5, {}, "data.partition.k"),
        ("classes", 3, {"k": 3}, "data.partition.k"),  # 3 x 3 < 10 classes
        ("iid", 0, {}, "data.num_clients"),
        ("iid", 5, {"train_fraction": 0.0}, "data.train_fraction"),
        ("iid", 5, {"test_fraction": 1.5}, "data.test_fraction"),
        ("iid", 1000, {}, "data.num_clients"),
        ("classes", 100, {"k": 1, "test_fraction": 0.5}, "data.num_clients"),  # 5 test samples, 10 holders
        ("pathological", 5, {}, "data.partition"),
    ],
)
def test_partition_errors_name_the_setting(kind: str, num_clients: int, kwargs: dict, field: str) -> None:
    with pytest.raises(DataError, match=field.replace(".", r"\.")):
        make_partition(kind, TRAIN_Y, TEST_Y, num_clients, seed=0, **kwargs)


def test_too_many_clients_message() -> None:
    with pytest.raises(DataError, match=r"client \d+ with no training data; lower data.num_clients"):
        make_partition("iid", TRAIN_Y, TEST_Y, 90, seed=0, train_fraction=0.1)
    with pytest.raises(DataError, match=r"501 clients but the data set has only 500 train samples; lower"):
        make_partition("iid", TRAIN_Y, TEST_Y, 501, seed=0)


def test_partition_stats_and_save_load(tmp_path: Path) -> None:
    p = make_partition("classes", TRAIN_Y, TEST_Y, 6, seed=0, k=2)
    stats = p.stats(TRAIN_Y, TEST_Y, 10)
    json.dumps(stats)  # plain Python types only
    assert stats["num_clients"] == 6 and sum(stats["train_sizes"]) == 500
    assert all(len(c) == 2 for c in stats["classes_per_client"])
    assert stats["size_min"] <= stats["size_mean"] <= stats["size_max"]
    path = tmp_path / "partition.npz"
    p.save(path)
    q = Partition.load(path)
    assert q.num_clients == 6 and os.listdir(tmp_path) == ["partition.npz"]
    assert all(np.array_equal(a, b) and b.dtype == np.int64 for a, b in zip(p.train + p.test, q.train + q.test))
    path.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="partition.npz"):
        Partition.load(path)
    with pytest.raises(DataError, match="missing.npz"):
        Partition.load(tmp_path / "missing.npz")


# --------------------------------------------------------------------------- datasets


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDSIM_DATA", raising=False)
    return tmp_path / "cache"


def write_layout(root: Path, classes: list[str], n_train: int = 2, n_test: int = 1, ext: str = "png") -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)).save(root / split / c / f"{i}.{ext}")


def zip_folder(folder: Path, dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w") as zf:
        for p in sorted(folder.rglob("*")):
            zf.write(p, p.relative_to(folder).as_posix())
    return dest


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = formats._decode_images

    def counting(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(formats, "_decode_images", counting)
    return calls


def test_image_zip_loads_and_is_cached(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shuffled = CIFAR10_CLASSES[::-1]
    write_layout(tmp_path / "layout", shuffled, n_train=3, n_test=2)
    (tmp_path / "data").mkdir()
    zip_folder(tmp_path / "layout", tmp_path / "data" / "cifar10-jpeg.zip")
    calls = count_decodes(monkeypatch)
    d = load_dataset("cifar10", tmp_path / "data")
    assert d.classes == tuple(CIFAR10_CLASSES) and d.num_classes == 10  # alphabetical
    assert d.train_x.shape == (30, 4, 6, 3) and d.test_x.shape == (20, 4, 6, 3) and d.input_shape == (3, 4, 6)
    assert d.train_x.dtype == np.uint8 and d.train_y.dtype == np.int64
    assert isinstance(d.train_x, np.memmap) and not d.train_x.flags.writeable
    assert np.array_equal(np.bincount(d.train_y), [3] * 10)
    expected = np.asarray(Image.open(tmp_path / "layout" / "train" / "airplane" / "0.png"))
    assert np.array_equal(d.train_x[d.train_y == 0][0], expected)
    assert len(d.mean) == len(d.std) == 3 and all(0 < m < 1 for m in d.mean)
    assert np.allclose(d.mean, (d.train_x / 255).mean(axis=(0, 1, 2)), atol=1e-4)
    assert np.allclose(d.std, (d.train_x / 255).std(axis=(0, 1, 2)), atol=1e-4)
    (folder,) = cache.iterdir()
    assert folder.name.startswith("cifar10-") and len(folder.name) == len("cifar10-") + 16
    assert json.loads((folder / "meta.json").read_text())["classes"] == CIFAR10_CLASSES
    again = load_dataset("cifar10", tmp_path / "data")
    assert calls == [1]  # second load memory-maps, no decoding
    assert np.array_equal(again.train_x, d.train_x)
    (folder / "test_y.npy").unlink()  # a damaged cache is rebuilt, not trusted
    load_dataset("cifar10", tmp_path / "data")
    assert calls == [1, 1] and (folder / "test_y.npy").exists()
    (folder / "meta.json").write_text("{")
    load_dataset("cifar10", tmp_path / "data")
    assert calls == [1, 1, 1] and len(list(cache.iterdir())) == 1  # no temp folders left behind


def test_changed_source_rebuilds(tmp_path: Path, cache: Path) -> None:
    write_layout(tmp_path / "cifar10", CIFAR10_CLASSES)
    load_dataset("cifar10", tmp_path)
    Image.new("RGB", (6, 4)).save(tmp_path / "cifar10" / "test" / "dog" / "1.png")  # a class folder changes
    d = load_dataset("cifar10", tmp_path)
    assert len(d.test_y) == 11 and len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("where", ["cifar10", ".", "cifar10.zip", "wrapped.zip"])
def test_image_folder_layouts(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    data = tmp_path / "data"
    if where.endswith(".zip"):
        write_layout(tmp_path / "layout" / ("cifar10" if where == "wrapped.zip" else ""), CIFAR10_CLASSES, ext="jpg")
        data.mkdir()
        zip_folder(tmp_path / "layout", data / "cifar10.zip")
    else:
        write_layout(data / where, CIFAR10_CLASSES, ext="jpg")
    monkeypatch.setenv("FEDSIM_DATA", str(data))  # root from the environment
    d = load_dataset("cifar10")
    assert d.train_x.shape == (20, 4, 6, 3) and d.test_x.shape == (10, 4, 6, 3)
    assert d.classes == tuple(CIFAR10_CLASSES) and np.array_equal(d.test_y, np.arange(10))


def write_pickles(folder: Path, files: dict[str, dict]) -> None:
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_bytes(pickle.dumps(content))


def test_torchvision_pickle_folders(tmp_path: Path, cache: Path) -> None:
    rng = np.random.default_rng(0)

    def batch(n: int, key: str, classes: int) -> dict:
        return {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), key: list(np.arange(n) % classes)}

    cifar10 = {f"data_batch_{i}": batch(10, "labels", 10) for i in range(1, 6)}
    write_pickles(tmp_path / "cifar-10-batches-py", cifar10 | {"test_batch": batch(10, "labels", 10),
                                                               "batches.meta": {"label_names": CIFAR10_CLASSES}})
    fine = [f"class{i:02d}" for i in range(100)]
    write_pickles(tmp_path / "cifar-100-python", {"train": batch(200, "fine_labels", 100),
                                                  "test": batch(100, "fine_labels", 100),
                                                  "meta": {"fine_label_names": fine}})
    d = load_dataset("cifar10", tmp_path)
    assert d.train_x.shape == (50, 32, 32, 3) and d.test_x.shape == (10, 32, 32, 3)
    assert d.classes == tuple(CIFAR10_CLASSES) and np.array_equal(d.train_y[:10], np.arange(10))
    row = cifar10["data_batch_1"]["data"][3]  # channel-major rows become HWC pixels
    assert np.array_equal(d.train_x[3], row.reshape(3, 32, 32).transpose(1, 2, 0))
    d100 = load_dataset("cifar100", tmp_path)
    assert d100.num_classes == 100 and d100.train_x.shape == (200, 32, 32, 3) and d100.train_y.max() == 99


def test_missing_data_names_the_setting(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(DataError, match=r"data\.root.*cifar10-jpeg\.zip.*FEDSIM_DATA"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(DataError, match=r"data\.root / FEDSIM_DATA"):
        resolve_root(None)
    with pytest.raises(DataError, match=r"data\.dataset"):
        load_dataset("mnist", tmp_path)


def test_bad_images_name_the_file(tmp_path: Path, cache: Path) -> None:
    write_layout(tmp_path / "cifar10", CIFAR10_CLASSES)
    odd = tmp_path / "cifar10" / "train" / "cat" / "9.png"
    Image.new("RGB", (5, 5)).save(odd)
    with pytest.raises(DataError, match=r"cat/9\.png is 5x5"):
        load_dataset("cifar10", tmp_path)
    odd.write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"cannot decode .*cat/9\.png"):
        load_dataset("cifar10", tmp_path)
    odd.unlink()
    (tmp_path / "cifar10" / "test" / "cat" / "0.png").rename(tmp_path / "cifar10" / "test" / "cat" / "0.txt")
    with pytest.raises(DataError, match="same classes"):
        load_dataset("cifar10", tmp_path)
    (tmp_path / "cifar10.zip").write_bytes(b"PK not really")
    (tmp_path / "cifar10").rename(tmp_path / "elsewhere")
    with pytest.raises(DataError, match=r"cifar10\.zip is not a readable zip"):
        load_dataset("cifar10", tmp_path)
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-built was left


def test_wrong_class_count(tmp_path: Path, cache: Path) -> None:
    write_layout(tmp_path / "cifar100", CIFAR10_CLASSES)
    with pytest.raises(DataError, match="has 10 classes but CIFAR-100 has 100"):
        load_dataset("cifar100", tmp_path)


def test_imagefolder_is_the_root_itself(tmp_path: Path, cache: Path) -> None:
    write_layout(tmp_path / "pets", ["zebra", "apple", "mango"])
    zip_folder(tmp_path / "pets", tmp_path / "pets.zip")
    expected = np.asarray(Image.open(tmp_path / "pets" / "test" / "zebra" / "0.png"))
    for root in (tmp_path / "pets", tmp_path / "pets.zip"):
        d = load_dataset("imagefolder", root)
        assert d.classes == ("apple", "mango", "zebra") and d.augmentable and d.train_groups is None
        assert d.train_x.shape == (6, 4, 6, 3) and np.array_equal(d.test_y, [0, 1, 2])
        assert np.array_equal(d.test_x[2], expected)
    assert sorted(f.name[:12] for f in cache.iterdir()) == ["imagefolder-"] * 2  # one cache per source
    with pytest.raises(DataError, match=r"data\.root: no image-folder data set .*a zip at the root itself") as e:
        load_dataset("imagefolder", tmp_path / "missing", download=True)
    assert "download" not in str(e.value)  # nothing to download an image folder from


def write_femnist(path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(path, train_x=rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), train_y=np.arange(6) * 10,
             train_writer=np.array([0, 0, 1, 1, 2, 2], np.int32),
             test_x=rng.integers(0, 256, (3, 28, 28), dtype=np.uint8), test_y=np.array([61, 0, 5]),
             test_writer=np.array([2, 0, 1], np.int32), writers=np.array(["a", "b", "c"]))


def test_femnist(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(DataError, match=r"no FEMNIST found .*femnist-leaf-sample\.npz\)") as e:
        load_dataset("femnist", tmp_path)
    assert "download" not in str(e.value)
    write_femnist(tmp_path / "femnist-leaf-sample.npz")
    d = load_dataset("femnist", tmp_path)
    with np.load(tmp_path / "femnist-leaf-sample.npz") as z:
        assert np.array_equal(d.train_x[..., 0], z["train_x"]) and np.array_equal(d.test_y, z["test_y"])
    assert d.train_x.shape == (6, 28, 28, 1) and d.input_shape == (1, 28, 28) and len(d.mean) == 1
    assert d.num_classes == 62 and d.classes[9:11] == ("9", "A") and d.classes[-1] == "z"
    assert not d.augmentable and isinstance(d.train_groups, np.memmap) and d.test_groups is not None
    assert d.train_groups.dtype == np.int64 and d.train_groups.tolist() == [0, 0, 1, 1, 2, 2]
    (folder,) = cache.iterdir()
    (folder / "test_groups.npy").unlink()  # a damaged cache is rebuilt, groups included
    assert load_dataset("femnist", tmp_path).test_groups.tolist() == [2, 0, 1]


def test_synthetic(cache: Path) -> None:
    options = {"alpha": 0.5, "beta": 0.5, "num_clients": 30, "seed": 0}
    d = load_dataset("synthetic", options=options)  # no root: the fixture unset FEDSIM_DATA
    assert d.train_x.dtype == d.test_x.dtype == np.float32 and d.train_x.shape[1:] == (1, 1, 60)
    assert d.input_shape == (60, 1, 1) and d.num_classes == 10 and not d.augmentable
    assert d.train_y.dtype == np.int64 and 0 <= d.train_y.min() and d.train_y.max() <= 9
    assert d.train_groups is not None and d.test_groups is not None
    train_sizes, test_sizes = np.bincount(d.train_groups, minlength=30), np.bincount(d.test_groups, minlength=30)
    assert train_sizes.min() >= 20 and np.array_equal(train_sizes, ((train_sizes + test_sizes) * 0.8).astype(int))
    assert train_sizes.std() > train_sizes.mean() / 2  # power-law sizes
    x = d.train_x[:5]
    assert torch.equal(to_float(x, d.mean, d.std), torch.from_numpy(x.copy()).permute(0, 3, 1, 2))
    assert not cache.exists()  # generated in memory
    again = load_dataset("synthetic", options=options)
    assert np.array_equal(again.train_x, d.train_x) and np.array_equal(again.test_y, d.test_y)
    assert not np.array_equal(load_dataset("synthetic", options=options | {"seed": 1}).train_x[:5], x)

    def client_mean_spread(beta: float) -> float:  # beta sets how far apart the clients' inputs lie
        s = load_dataset("synthetic", options=options | {"alpha": 0.0, "beta": beta})
        return float(np.std([s.train_x[s.train_groups == k].mean() for k in range(30)]))

    assert client_mean_spread(0.0) < 0.5 < client_mean_spread(2.0)
    assert load_dataset("synthetic").train_x.shape[1:] == (1, 1, 60)  # defaults


@pytest.mark.parametrize("options", [{"gamma": 1}, {"alpha": -1}, {"num_clients": 0}, {"beta": "high"}])
def test_synthetic_options_are_checked(cache: Path, options: dict) -> None:
    with pytest.raises(DataError, match=r"^data\.options: [^\n]*$"):
        load_dataset("synthetic", options=options)


@pytest.mark.skipif(not os.environ.get("FEDSIM_DATA"), reason="set FEDSIM_DATA to the shared datasets folder")
def test_real_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.environ.get("FEDSIM_CACHE"):  # reuse a shared cache when given, else decode into tmp
        monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path))
    d = load_dataset("cifar10")
    assert d.train_x.shape == (50000, 32, 32, 3) and d.test_x.shape == (10000, 32, 32, 3)
    assert d.num_classes == 10 and d.classes[0] == "airplane"
    assert np.array_equal(np.bincount(d.train_y), [5000] * 10)


# --------------------------------------------------------------------------- transforms


def test_to_float() -> None:
    x = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    x.setflags(write=False)  # like a memory-mapped batch
    t = to_float(x, (0.5, 0.4, 0.3), (0.2, 0.25, 0.5))
    assert t.shape == (2, 3, 4, 4) and t.dtype == torch.float32 and t.is_contiguous()
    assert torch.allclose(t[1, 2, 3, 0], torch.tensor((x[1, 3, 0, 2] / 255 - 0.3) / 0.5, dtype=torch.float32))
    features = np.linspace(-1, 1, 2 * 3, dtype=np.float32).reshape(2, 1, 1, 3)  # float input: no / 255
    f = to_float(features, (0.5, 0.0, 0.0), (2.0, 1.0, 1.0))
    assert f.shape == (2, 3, 1, 1) and f.dtype == torch.float32
    assert torch.allclose(f[1, 0, 0, 0], torch.tensor((features[1, 0, 0, 0] - 0.5) / 2.0))


def test_random_crop_flip() -> None:
    x = torch.randn(64, 3, 32, 32)
    a = random_crop_flip(x, torch.Generator().manual_seed(0))
    b = random_crop_flip(x, torch.Generator().manual_seed(0))
    c = random_crop_flip(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, x)
    # Every output is a shifted (and possibly mirrored) copy: its interior matches the input's.
    for out, img in zip(a, x):
        found = False
        for candidate in (img, img.flip(-1)):
            for dy in range(-4, 5):
                for dx in range(-4, 5):
                    shifted = candidate[:, 4 + dy:28 + dy, 4 + dx:28 + dx]
                    found |= torch.equal(out[:, 4:28, 4:28], shifted)
        assert found
    flips = random_crop_flip(x, torch.Generator().manual_seed(0), padding=0)
    is_flip = [torch.equal(o, i.flip(-1)) for o, i in zip(flips, x)]
    assert all(f or torch.equal(o, i) for f, o, i in zip(is_flip, flips, x)) and 10 < sum(is_flip) < 54


def write_class_folders(root: Path, sizes: dict[str, int], shape: tuple[int, int] = (4, 6)) -> None:
    """torchvision's ImageFolder layout, root/<class>/<image>, with no train/ and test/."""
    rng = np.random.default_rng(1)
    for c, n in sizes.items():
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


def test_class_folders_alone_are_split_per_class_from_the_seed_by_data_test_split(tmp_path: Path, cache: Path) -> None:
    from fedsim.config import DataConfig
    from fedsim.data import load_run_data

    write_class_folders(tmp_path / "pets", {"cat": 10, "dog": 5, "emu": 1})
    with pytest.raises(DataError, match=r"data\.test_split: .*pets holds <class>/ image folders without train/ and "
                                        r"test/; set data\.test_split \(e\.g\. 0\.2\)"):
        load_run_data(DataConfig(dataset="imagefolder", root=str(tmp_path / "pets")), seed=0)
    split = DataConfig(dataset="imagefolder", root=str(tmp_path / "pets"), test_split=0.2)
    d, again, other = (load_run_data(split, seed) for seed in (3, 3, 4))
    assert d.classes == ("cat", "dog", "emu")
    # 20% of each class: 2 of 10 cats, 1 of 5 dogs, none of the one emu (a class keeps at least one training image)
    assert np.bincount(d.test_y, minlength=3).tolist() == [2, 1, 0] and np.bincount(d.train_y).tolist() == [8, 4, 1]
    assert np.array_equal(d.test_x, again.test_x) and not np.array_equal(d.test_x, other.test_x)  # from the seed
    everything = np.concatenate([d.train_x, d.test_x]).reshape(16, -1)
    assert len({row.tobytes() for row in everything}) == 16  # every image once, in train or in test
    assert d.input_shape == (3, 4, 6) and len(d.mean) == 3
    with pytest.raises(DataError, match="data.test_split: imagefolder has a test set of its own"):
        write_layout(tmp_path / "split", ["a", "b"])
        load_run_data(DataConfig(dataset="imagefolder", root=str(tmp_path / "split"), test_split=0.2), seed=0)
