"""Data sets by name: where each is found under the data root, read once into the cache and loaded from it.

Files are decoded once into the cache (``fedsim.data.cache``) and memory-mapped afterwards; generated data sets
(synthetic) are rebuilt in memory from their seed instead; ``package.module:function`` names a user's own.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim import storage
from fedsim.config import DataConfig
from fedsim.data.array_dataset import ArrayDataset, recomputed_digest
from fedsim.data.contract import checked
from fedsim.data.cache import build_cache, cache_dir, cached, channel_stats, open_cache, source_key
from fedsim.data.formats import (CIFAR10_PICKLES, CIFAR100_PICKLES, CLASS_FOLDERS, FEMNIST_NPZ, IMAGE_FOLDER, IMAGE_ZIP,
                                 Arrays, Reader)
from fedsim.data.shakespeare import shakespeare
from fedsim.data.speakers import shakespeare_speakers
from fedsim.data.synthetic import synthetic
from fedsim.errors import DataError, PluginError
from fedsim.plugins import Signature, is_plugin, load_plugin, user_call


def resolve_root(root: str | Path | None) -> Path:
    """The data folder: the ``data.root`` setting, else the FEDSIM_DATA environment variable."""
    chosen = root or os.environ.get("FEDSIM_DATA")
    if not chosen:
        raise DataError(
            "data.root / FEDSIM_DATA: no data folder given; set data.root in the config "
            "or the FEDSIM_DATA environment variable to the folder holding the data sets"
        )
    return storage.user_path(chosen)


@dataclass(frozen=True)
class _Spec:
    """A data set read from files under the root."""

    title: str
    num_classes: int | None  # None: as many as the files hold
    candidates: tuple[tuple[str, Reader], ...]  # searched in order under the root ("." = the root itself)
    torchvision_class: str | None = None  # download=True uses it; it writes one of the candidate folders
    augmentable: bool = True


def _from_the_tarball(build: Callable[[Path | None, dict], ArrayDataset]) -> Callable[[str | Path | None, dict],
                                                                                 ArrayDataset]:
    """A data set parsed from the Shakespeare tarball: found under the data root, unless data.options.path names it
    (then no root is needed)."""
    def load(root: str | Path | None, options: dict) -> ArrayDataset:
        return build(None if options.get("path") else resolve_root(root), options)
    return load


# Adding a data set is one entry here: a _Spec, or a builder taking the data root (as given) and the ``options`` dict.
_DATASETS: dict[str, _Spec | Callable[[str | Path | None, dict], ArrayDataset]] = {
    "cifar10": _Spec(
        "CIFAR-10", 10,
        (("cifar10-jpeg.zip", IMAGE_ZIP), ("cifar10", IMAGE_FOLDER), (".", IMAGE_FOLDER), ("cifar10.zip", IMAGE_ZIP),
         ("cifar-10-batches-py", CIFAR10_PICKLES)),
        "CIFAR10",
    ),
    "cifar100": _Spec(
        "CIFAR-100", 100,
        (("cifar100-images.zip", IMAGE_ZIP), ("cifar100", IMAGE_FOLDER), (".", IMAGE_FOLDER),
         ("cifar100.zip", IMAGE_ZIP), ("cifar-100-python", CIFAR100_PICKLES)),
        "CIFAR100",
    ),
    "femnist": _Spec("FEMNIST", 62, (("femnist-leaf-sample.npz", FEMNIST_NPZ),), augmentable=False),
    # data.root names the image folder or its zip itself; a folder of <class>/ folders alone needs data.test_split.
    "imagefolder": _Spec("image-folder data set", None, ((".", IMAGE_ZIP), (".", IMAGE_FOLDER), (".", CLASS_FOLDERS))),
    "synthetic": lambda root, options: synthetic(options),  # generated: no root
    "shakespeare": _from_the_tarball(shakespeare),
    "shakespeare_speakers": _from_the_tarball(shakespeare_speakers),  # speaker attribution, MiniLM's tokens (docs/speakers.md)
}


def _find_source(spec: _Spec, root: Path, download: bool) -> tuple[Path, Callable[[Path], Arrays]]:
    for rel, (looks_ok, read) in spec.candidates:
        try:
            path = (root / rel).resolve()
        except RuntimeError:  # Python 3.11's resolve() on a link that leads back to itself
            raise DataError(f"data.root: {root / rel} is a symbolic link that leads back to itself (check FEDSIM_DATA "
                            "and data.root); point it at the data folder") from None
        if looks_ok(path):
            return path, read
    if download and spec.torchvision_class:
        import torchvision  # only needed online; importing it costs ~1 s

        try:
            getattr(torchvision.datasets, spec.torchvision_class)(str(root), download=True)
        except Exception as e:  # network and archive errors come in many types
            raise DataError(f"data.download: fetching {spec.title} into {root} failed ({e}); "
                            "check the connection or place the data under data.root") from e
        return _find_source(spec, root, download=False)
    looked = ", ".join("a zip at the root itself" if rel == "." and reader is IMAGE_ZIP
                       else "<class>/ image folders (with data.test_split)" if reader is CLASS_FOLDERS
                       else "train/ + test/ image folders" if rel == "."
                       else rel if reader[0] is Path.is_file else rel + "/"
                       for rel, reader in spec.candidates)
    online = ", or data.download: true when online" if spec.torchvision_class else ""
    raise DataError(f"data.root: no {spec.title} found under {root} (looked for {looked}); set data.root or "
                    f"FEDSIM_DATA to the folder holding it{online}")


def _read_checked(spec: _Spec, source: Path, read: Callable[[Path], Arrays]) -> Arrays:
    """The source's arrays, refused where they hold another number of classes than the data set has."""
    arrays = read(source)
    if spec.num_classes is not None and len(arrays.classes) != spec.num_classes:
        raise DataError(f"data.root: {source} has {len(arrays.classes)} classes but {spec.title} has "
                        f"{spec.num_classes}; point data.root at the right data set")
    return arrays


USER_DATASET = Signature(("root", "options"), returns="a fedsim.data.ArrayDataset")


def _user_dataset(name: str, root: str | Path | None, options: dict) -> ArrayDataset:
    """``data.dataset: package.module:function``, called as ``USER_DATASET`` says."""
    try:
        make = load_plugin(name, "data.dataset", USER_DATASET)
        with user_call(name, "data.dataset", USER_DATASET):
            dataset = make(root, options)
    except PluginError as err:
        raise DataError(str(err)) from None
    if not isinstance(dataset, ArrayDataset):
        raise DataError(f"data.dataset: {name!r} returned a {type(dataset).__name__}; return a "
                        "fedsim.data.ArrayDataset")
    dataset = checked(dataset, name)
    # A resumed run compares the data with what it started on: a user's data set gets its content hash too.
    return dataset if dataset.digest else dataclasses.replace(dataset, digest=recomputed_digest(dataset))


def load_dataset(name: str, root: str | Path | None = None, download: bool = False,
                 options: dict | None = None) -> ArrayDataset:
    """Load a data set by name from ``root`` (or FEDSIM_DATA), decoding only on first use.

    Built data sets take their parameters from ``options`` (synthetic, generated, needs no root; shakespeare,
    parsed from its tarball); the others ignore it.
    """
    if is_plugin(name):
        return _user_dataset(name, root, options or {})
    spec = _DATASETS.get(name)
    if spec is None:
        raise DataError(f"data.dataset: unknown data set {name!r}; choose one of {', '.join(_DATASETS)} "
                        "or give 'package.module:function'")
    if not isinstance(spec, _Spec):
        return spec(root, options or {})
    source, read = _find_source(spec, resolve_root(root), download)
    folder = cache_dir() / f"{name}-{source_key(source)}"
    return cached(folder, lambda: open_cache(name, folder, spec.augmentable),
                  lambda: build_cache(folder, source, _read_checked(spec, source, read), spec.augmentable))


TEST_SPLIT_STREAM = 0x7E57  # data.test_split's draw: its own stream of the run's seed


def load_run_data(data: DataConfig, seed: int) -> ArrayDataset:
    """The data set a run of ``data`` trains and tests on (the driver's and every worker's alike): ``load_dataset``,
    with data.test_split's test set split off where the data comes without one."""
    dataset = load_dataset(data.dataset, data.root, data.download, options=data.options)
    has_test = len(dataset.test_y) > 0
    if data.test_split is None and not has_test:
        raise DataError(f"data.test_split: {data.root or data.dataset} holds <class>/ image folders without train/ and "
                        "test/; set data.test_split (e.g. 0.2) to make that share of each class's images the test set")
    if data.test_split is not None and has_test:
        raise DataError(f"data.test_split: {data.dataset} has a test set of its own ({len(dataset.test_y)} samples); "
                        "leave data.test_split out")
    return dataset if data.test_split is None else split_test(dataset, data.test_split, seed)


def split_test(data: ArrayDataset, fraction: float, seed: int) -> ArrayDataset:
    """``fraction`` of each class's samples (rounded, at least one and never all of a class with two or more) as the
    test set, drawn from ``seed``; the rest train, in their original order. The channel statistics are the new
    training set's; the digest stays the source's (the split is a function of it and the config)."""
    rng = np.random.default_rng([seed, TEST_SPLIT_STREAM])
    test = []
    for label in range(data.num_classes):
        members = np.flatnonzero(data.train_y == label)
        size = min(len(members) - 1, max(1, round(fraction * len(members)))) if len(members) > 1 else 0
        test.append(rng.permutation(members)[:size])
    is_test = np.zeros(len(data.train_y), bool)
    is_test[np.concatenate(test)] = True
    train_x = np.ascontiguousarray(data.train_x[~is_test])
    mean, std = channel_stats(train_x)
    return dataclasses.replace(data, train_x=train_x, train_y=data.train_y[~is_test], test_x=data.train_x[is_test],
                               test_y=data.train_y[is_test], mean=mean, std=tuple(s if s > 0 else 1.0 for s in std))
