"""The decode-once cache: a data set's arrays saved as ``.npy`` files and memory-mapped afterwards.

<cache_dir>/<name>-<key>/{train_x,train_y,test_x,test_y}.npy + meta.json (+ {train_groups,test_groups}.npy when
the source has per-sample client ids). Decoding 60k small images costs seconds; memory-mapping the cached arrays
costs milliseconds and lets every worker process share the same pages instead of holding its own copy. Built data
sets use it too: shakespeare's windows (270 MB for every modern client) are built once per parse and mapped after.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.atomic import space_named
from fedsim.data.array_dataset import ARRAYS, GROUPS, ArrayDataset, content_digest
from fedsim.data.formats import Arrays
from fedsim.errors import DataError


def cache_dir() -> Path:
    """The folder of every cached data set: FEDSIM_CACHE, else ~/.cache/fedsim."""
    return Path(os.environ.get("FEDSIM_CACHE") or Path.home() / ".cache" / "fedsim").expanduser()


def source_key(source: Path) -> str:
    """Hash of the source's path, size and mtime, so a replaced source gets a fresh cache.

    For a folder, every directory beneath it counts too: adding, removing or renaming an image
    changes its class folder's mtime (listing the ~200 folders of CIFAR takes ~20 ms). Editing a
    file in place goes unnoticed; delete the cache folder then.
    """
    paths = [source] + sorted(Path(d) / n for d, dirs, _ in os.walk(source) for n in dirs)
    h = hashlib.sha256()
    for path in paths:
        st = path.stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std in [0, 1] units.

    Integer sums of x and x^2 over 1M-pixel chunks, combined as exact Python ints: no float64
    copy of the whole set (1.2 GB for CIFAR) and no cancellation error in E[x^2] - E[x]^2.
    """
    flat = x.reshape(-1, x.shape[-1])
    total = squares = np.zeros(flat.shape[1], np.int64)
    for i in range(0, len(flat), 1 << 20):
        chunk = flat[i:i + (1 << 20)].astype(np.int64)
        total = total + chunk.sum(0)
        squares = squares + np.einsum("ij,ij->j", chunk, chunk)
    n = len(flat)
    mean = tuple(round(int(t) / n / 255, 4) for t in total)
    std = tuple(round(math.sqrt(n * int(q) - int(t) ** 2) / n / 255, 4) for t, q in zip(total, squares))
    return mean, std


def open_cache(name: str, folder: Path, augmentable: bool) -> ArrayDataset | None:
    """The cached data set, or None when the folder is missing or damaged (then it is rebuilt)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        arrays = [np.load(folder / f"{a}.npy", mmap_mode="r", allow_pickle=False)
                  for a in ARRAYS + (GROUPS if meta.get("groups") else ())]
        train_x, train_y, test_x, test_y, *groups = arrays
        train_groups, test_groups = groups or (None, None)
        # A constant channel (std 0) would divide by zero: left unscaled it is just 0 after centring.
        std = tuple(float(s) if s > 0 else 1.0 for s in meta["std"])
        dataset = ArrayDataset(name, train_x, train_y, test_x, test_y, tuple(meta["classes"]),
                               tuple(meta["mean"]), std, train_groups, test_groups, augmentable=augmentable,
                               digest=meta.get("digest") or content_digest(*arrays),  # caches from before digests
                               window=int(meta.get("window", 0)), about=meta.get("about"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # AttributeError: meta not a dict
        return None
    channels = train_x.shape[-1] if train_x.ndim == 4 else -1
    consistent = (
        train_x.dtype == test_x.dtype == np.uint8 and all(a.dtype == np.int64 for a in (train_y, test_y, *groups))
        and train_x.ndim == test_x.ndim == 4 and train_x.shape[1:] == test_x.shape[1:]
        and len(train_x) == len(train_y) and len(test_x) == len(test_y)
        and (not groups or (len(groups[0]) == len(train_y) and len(groups[1]) == len(test_y)))
        and len(dataset.mean) == len(dataset.std) == channels
        and all(len(y) == 0 or (0 <= int(y.min()) and int(y.max()) < len(dataset.classes)) for y in (train_y, test_y))
    )
    return dataset if consistent else None  # labels out of range, like any damage, rebuild the cache


def unfit(arrays: Arrays) -> str | None:
    """What makes ``arrays`` no data set (what :func:`open_cache` would refuse), or None: found before the cache is
    written, so the source is named instead of the cache."""
    xs, ys = (arrays.train_x, arrays.test_x), (arrays.train_y, arrays.test_y)
    if any(x.dtype != np.uint8 or x.ndim != 4 for x in xs):
        bad = next(x for x in xs if x.dtype != np.uint8 or x.ndim != 4)
        return f"holds {bad.dtype} images shaped {bad.shape[1:]}, not 8-bit pixels (height, width, channels)"
    if xs[0].shape[1:] != xs[1].shape[1:]:
        return f"holds train images of {xs[0].shape[1:]} and test images of {xs[1].shape[1:]}"
    groups = (arrays.train_groups, arrays.test_groups)
    for split, x, y, g in zip(("train", "test"), xs, ys, groups):
        if len(y) != len(x) or (g is not None and len(g) != len(x)):
            return f"holds {len(x)} {split} images but {len(y)} labels{'' if g is None else f' and {len(g)} groups'}"
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and not 0 <= int(y.min()) <= int(y.max()) < len(
                arrays.classes)):
            return f"holds {split} labels that are not class indices 0..{len(arrays.classes) - 1}"
    return None


Stats = tuple[tuple[float, ...], tuple[float, ...]]  # per-channel (mean, std), as ArrayDataset holds them


def build_cache(folder: Path, source: Path, arrays: Arrays, augmentable: bool, stats: Stats | None = None,
                window: int = 0, about: Mapping[str, Any] | None = None) -> None:
    """Save ``arrays`` (read from ``source``) with their channel statistics (``stats``, else measured over the
    images) and content hash as the cache ``folder``; ``window`` and ``about`` as ArrayDataset takes them."""
    problem = unfit(arrays)
    if problem is not None:
        raise DataError(f"data.root: {source} {problem}; replace it with an intact copy")
    mean, std = stats or channel_stats(arrays.train_x)
    has_groups = arrays.train_groups is not None
    names = ARRAYS + (GROUPS if has_groups else ())
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target under a name of our own, then rename: no reader ever sees a half-written cache.
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared
        for a in names:
            with space_named(folder / f"{a}.npy", getattr(arrays, a).nbytes):
                np.save(tmp / f"{a}.npy", getattr(arrays, a))
        meta = {"classes": list(arrays.classes), "mean": mean, "std": std, "source": str(source), "groups": has_groups,
                "digest": content_digest(*(getattr(arrays, a) for a in names)), "window": window, "about": about}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish(tmp, folder, lambda: open_cache(folder.name, folder, augmentable))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached(folder: Path, opened: Callable[[], ArrayDataset | None], build: Callable[[], None]) -> ArrayDataset:
    """The data set ``opened`` reads from ``folder`` (None: missing or damaged), made there by ``build`` when it
    reads none."""
    dataset = opened()
    if dataset is None:
        build()
        dataset = opened()
    if dataset is None:
        raise DataError(f"FEDSIM_CACHE: could not build a usable cache at {folder}; delete it or point "
                        "FEDSIM_CACHE at a writable folder")
    return dataset


def publish(tmp: Path, folder: Path, opened: Callable[[], ArrayDataset | None]) -> None:
    """Rename ``tmp`` to ``folder`` unless another process got there first. A folder already in place is
    only moved aside (then deleted) when it is damaged (``opened`` reads none from it), and only if it is still
    damaged right before: a cache another process just published, and may be reading, is never removed."""
    if folder.exists() and opened() is None:
        trash = folder.with_name(f".{folder.name}-damaged-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(folder, trash)
        except OSError:
            pass  # someone else moved it first
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, folder)  # fails on an existing non-empty folder: a concurrent winner stays
    except OSError:
        pass  # another process published its complete copy first: use theirs
