"""Data sets as NHWC arrays: files decoded once into a cache and memory-mapped afterwards.

Decoding 60k small images costs seconds; memory-mapping the cached arrays costs milliseconds
and lets every worker process share the same pages instead of holding its own copy. Generated
data sets (synthetic) are rebuilt in memory from their seed instead.
"""

from __future__ import annotations

import hashlib
import dataclasses
import io
import json
import math
import os
import pickle
import re
import shutil
import string
import tempfile
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from fedsim.errors import DataError
from fedsim.plugins import PluginError, is_plugin, load_plugin


class Arrays(NamedTuple):
    """What a reader gets out of one on-disk format."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...]
    train_groups: np.ndarray | None = None  # per-sample client ids, for naturally federated data
    test_groups: np.ndarray | None = None


# (does this path look like the format?, read it)
Reader = tuple[Callable[[Path], bool], Callable[[Path], Arrays]]

_IMAGE_EXTS = (".jpg", ".jpeg", ".png")
# A zip may hold the layout at its top level or inside one wrapping folder ("cifar10/train/...").
_ZIP_MEMBER = re.compile(r"^(?:[^/]+/)?(train|test)/([^/]+)/[^/]+$")
_ARRAYS = ("train_x", "train_y", "test_x", "test_y")
_GROUPS = ("train_groups", "test_groups")


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value, compare by identity
class ArrayDataset:
    name: str
    train_x: np.ndarray  # (N, H, W, C): uint8 images (a read-only memory map of the cache) or float32 features
    train_y: np.ndarray  # int64 (N,)
    test_x: np.ndarray  # (M, H, W, C), same dtype
    test_y: np.ndarray  # int64 (M,)
    classes: tuple[str, ...]
    mean: tuple[float, ...]  # per channel, over train_x, in the units ``to_float`` scales to ([0, 1] for uint8)
    std: tuple[float, ...]
    train_groups: np.ndarray | None = None  # int64 (N,): the natural client (e.g. writer) of each sample
    test_groups: np.ndarray | None = None  # int64 (M,)
    augmentable: bool = True  # whether random crop + flip keeps the label (not for letters or features)
    digest: str = ""  # hash of the arrays' content: a resumed run refuses data that changed under it

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W), the layout models see after ``to_float``."""
        _, h, w, c = self.train_x.shape
        return (c, h, w)


def resolve_root(root: str | Path | None) -> Path:
    """The data folder: the ``data.root`` setting, else the FEDSIM_DATA environment variable."""
    chosen = root or os.environ.get("FEDSIM_DATA")
    if not chosen:
        raise DataError(
            "data.root / FEDSIM_DATA: no data folder given; set data.root in the config "
            "or the FEDSIM_DATA environment variable to the folder holding the data sets"
        )
    return Path(chosen).expanduser()


def cache_dir() -> Path:
    return Path(os.environ.get("FEDSIM_CACHE") or Path.home() / ".cache" / "fedsim").expanduser()


def content_digest(*arrays: np.ndarray | None) -> str:
    """sha256 over the arrays' dtypes, shapes and bytes (CIFAR-10's 180 MB: about half a second)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(memoryview(np.ascontiguousarray(a)).cast("B"))
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Readers: each turns one on-disk format into Arrays.


def _rgb8(img: Image.Image) -> np.ndarray:
    """(H, W, 3) uint8 pixels. Pillow's RGB conversion clips 16-bit greyscale to 255 (a 16-bit PNG becomes almost
    all white): those are scaled from their 0..65535 range; 32-bit integer or float images are refused."""
    if img.mode.startswith("I;16"):
        grey = np.rint(np.asarray(img, dtype=np.float64) * (255.0 / 65535.0)).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=-1)
    if img.mode in ("I", "F"):
        raise ValueError(f"a {img.mode}-mode (32-bit) image; save it as 8- or 16-bit")
    return np.asarray(img.convert("RGB"))


def _decode_images(source: Path, members: list[str], read: Callable[[str], bytes]) -> np.ndarray:
    """Decode images to one (N, H, W, 3) uint8 array.

    Sequential on purpose: with 32x32 images Pillow's per-call overhead holds the GIL, and a
    thread pool measured ~1.7x slower than a plain loop.
    """
    out: np.ndarray | None = None
    for i, member in enumerate(members):
        try:
            with Image.open(io.BytesIO(read(member))) as img:
                pixels = _rgb8(img)
        except Image.DecompressionBombError as e:  # tiny file, billions of pixels: refused before decoding
            raise DataError(f"data.root: {source}/{member} is too large to decode ({e}); remove it") from None
        except (OSError, ValueError, zipfile.BadZipFile) as e:  # UnidentifiedImageError is OSError
            raise DataError(f"data.root: cannot decode {source}/{member} ({e}); replace or remove it") from e
        if out is None:
            out = np.empty((len(members), *pixels.shape), np.uint8)
        elif pixels.shape != out.shape[1:]:
            raise DataError(
                f"data.root: {source}/{member} is {pixels.shape[1]}x{pixels.shape[0]} but earlier images are "
                f"{out.shape[2]}x{out.shape[1]}; resize all images to one size"
            )
        out[i] = pixels
    assert out is not None  # callers pass at least one member per split
    return out


def _decode_layout(source: Path, files: dict[str, list[tuple[str, str]]], read: Callable[[str], bytes]) -> Arrays:
    """Image-folder layout: files[split] = [(class folder, member)]; class id = alphabetical rank."""
    train_classes, test_classes = ({c for c, _ in files[s]} for s in ("train", "test"))
    if not train_classes or train_classes != test_classes:
        raise DataError(
            f"data.root: {source} needs train/<class>/ and test/<class>/ image folders with the same classes "
            f"(train has {len(train_classes)}, test has {len(test_classes)}, differing: "
            f"{sorted(train_classes ^ test_classes)[:5]}); fix the folders"
        )
    classes = tuple(sorted(train_classes))
    index = {c: i for i, c in enumerate(classes)}
    train, test = (sorted(files[s]) for s in ("train", "test"))  # sorted: same order on every OS
    x = _decode_images(source, [m for _, m in train + test], read)
    y = np.array([index[c] for c, _ in train + test], np.int64)
    n = len(train)
    return Arrays(x[:n], y[:n], x[n:], y[n:], classes)


def _is_image(member: str) -> bool:
    """An image file by its name, but not the metadata macOS adds: ``__MACOSX/`` folders in zips and
    ``._name.jpg`` AppleDouble files, which carry an image's extension but are not images."""
    parts = member.split("/")
    return (member.lower().endswith(_IMAGE_EXTS) and "__MACOSX" not in parts
            and not any(part.startswith(".") for part in parts))


def _read_image_folder(root: Path) -> Arrays:
    files = {
        split: [(p.parent.name, p.relative_to(root).as_posix()) for p in (root / split).glob("*/*")
                if _is_image(p.relative_to(root).as_posix())]
        for split in ("train", "test")
    }
    return _decode_layout(root, files, lambda member: (root / member).read_bytes())


def _read_image_zip(path: Path) -> Arrays:
    try:
        with zipfile.ZipFile(path) as zf:
            files: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
            for member in zf.namelist():
                match = _ZIP_MEMBER.match(member)
                if match and _is_image(member):
                    files[match[1]].append((match[2], member))
            return _decode_layout(path, files, zf.read)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"data.root: {path} is not a readable zip ({e}); replace it") from e


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays, nothing else: a pickle names any
    callable to run on load, and a file placed under data.root must not be able to run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),  # numpy ints in label lists
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only arrays, lists and dicts are read")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    # The CIFAR python archives are Python 2 pickles: latin1 is how torchvision reads them too.
    try:
        with path.open("rb") as f:
            batch = _ArraysOnlyUnpickler(f, encoding="latin1").load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise DataError(f"data.root: cannot read {path} ({e}); replace the folder {path.parent}") from None
    if not isinstance(batch, dict):
        raise DataError(f"data.root: {path} holds a {type(batch).__name__}, not a CIFAR batch; replace the folder "
                        f"{path.parent}")
    return batch


def _pickle_reader(train: list[str], test: str, meta: str, labels: str, names: str) -> Callable[[Path], Arrays]:
    def read(folder: Path) -> Arrays:
        def split(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
            batches = [_unpickle(folder / f) for f in files]
            try:  # rows are 3072 bytes: 1024 R, then G, then B
                x = np.concatenate([np.asarray(b["data"], np.uint8).reshape(-1, 3, 32, 32) for b in batches])
                y = np.concatenate([np.asarray(b[labels], np.int64) for b in batches])
            except (KeyError, ValueError) as e:
                raise DataError(f"data.root: {folder} has malformed batches ({e!r}); replace it") from e
            return np.ascontiguousarray(x.transpose(0, 2, 3, 1)), y

        train_x, train_y = split(train)
        test_x, test_y = split([test])
        return Arrays(train_x, train_y, test_x, test_y, tuple(_unpickle(folder / meta)[names]))

    return read


def _read_femnist(path: Path) -> Arrays:
    """LEAF's FEMNIST sample (schema in the shared datasets README); groups = writer index."""
    try:
        with np.load(path, allow_pickle=False) as z:
            x, y, g = ({s: z[f"{s}_{a}"] for s in ("train", "test")} for a in ("x", "y", "writer"))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise DataError(f"data.root: {path} is not a FEMNIST npz ({e}); replace it") from e
    return Arrays(x["train"][..., None], y["train"].astype(np.int64), x["test"][..., None], y["test"].astype(np.int64),
                  tuple(string.digits + string.ascii_uppercase + string.ascii_lowercase),  # LEAF's label order
                  g["train"].astype(np.int64), g["test"].astype(np.int64))


_ZIP: Reader = (Path.is_file, _read_image_zip)
_FOLDER: Reader = (lambda p: (p / "train").is_dir(), _read_image_folder)
_CIFAR10_PICKLES: Reader = (
    Path.is_dir,
    _pickle_reader([f"data_batch_{i}" for i in range(1, 6)], "test_batch", "batches.meta", "labels", "label_names"),
)
_CIFAR100_PICKLES: Reader = (
    Path.is_dir,
    _pickle_reader(["train"], "test", "meta", "fine_labels", "fine_label_names"),
)


# ---------------------------------------------------------------------------------------------
# Generated data sets: built in memory from their options, deterministic in the seed.

_SYNTHETIC_OPTIONS = {"alpha": 0.5, "beta": 0.5, "num_clients": 30, "seed": 0}


def _synthetic(options: dict) -> ArrayDataset:
    """FedProx's Synthetic(alpha, beta) (Li et al. 2020, generate_synthetic.py in their repo).

    Per client k: u_k ~ N(0, alpha), B_k ~ N(0, beta) (standard deviations, as the repo's
    np.random.normal calls), W_k, b_k ~ N(u_k, 1), v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)),
    y = argmax(W_k x + b_k). alpha moves the models apart, beta the inputs. Sizes are the repo's
    int(lognormal(4, 2)) + 50, so every client keeps >= 40 train samples after the 80/20 split.
    """
    unknown = sorted(set(options) - set(_SYNTHETIC_OPTIONS))
    if unknown:
        raise DataError(f"data.options: unknown synthetic option(s) {unknown}; use {', '.join(_SYNTHETIC_OPTIONS)}")
    o = _SYNTHETIC_OPTIONS | options
    try:
        alpha, beta, n, seed = float(o["alpha"]), float(o["beta"]), int(o["num_clients"]), int(o["seed"])
    except (TypeError, ValueError) as e:
        raise DataError(f"data.options: synthetic options must be numbers ({e})") from e
    if alpha < 0 or beta < 0 or n < 1:
        raise DataError(f"data.options: synthetic needs alpha >= 0, beta >= 0, num_clients >= 1; got {o}")
    dim, num_classes = 60, 10
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, n).astype(np.int64) + 50
    u, b_mean = rng.normal(0, alpha, n), rng.normal(0, beta, n)
    sd = np.arange(1, dim + 1) ** -0.6  # sqrt of the covariance diagonal j^-1.2
    xs, ys = [], []
    for k, size in enumerate(sizes):
        w, b = rng.normal(u[k], 1, (dim, num_classes)), rng.normal(u[k], 1, num_classes)
        xs.append(rng.normal(b_mean[k], 1, dim) + sd * rng.standard_normal((size, dim)))
        ys.append(np.argmax(xs[-1] @ w + b, axis=1))
    x, y = np.concatenate(xs).astype(np.float32).reshape(-1, 1, 1, dim), np.concatenate(ys).astype(np.int64)
    groups = np.repeat(np.arange(n, dtype=np.int64), sizes)
    train = np.concatenate([np.arange(size) < int(0.8 * size) for size in sizes])  # each client's first 80%
    classes = tuple(str(c) for c in range(num_classes))
    arrays = (x[train], y[train], x[~train], y[~train])
    return ArrayDataset("synthetic", *arrays, classes,
                        (0.0,) * dim, (1.0,) * dim,  # features stay as generated: to_float is the identity
                        groups[train], groups[~train], augmentable=False,
                        digest=content_digest(*arrays, groups[train], groups[~train]))


@dataclass(frozen=True)
class _Spec:
    """A data set read from files under the root."""

    title: str
    num_classes: int | None  # None: as many as the files hold
    candidates: tuple[tuple[str, Reader], ...]  # searched in order under the root ("." = the root itself)
    torchvision_class: str | None = None  # download=True uses it; it writes one of the candidate folders
    augmentable: bool = True


# Adding a data set is one entry here: a _Spec, or a generator taking the ``options`` dict.
_DATASETS: dict[str, _Spec | Callable[[dict], ArrayDataset]] = {
    "cifar10": _Spec(
        "CIFAR-10", 10,
        (("cifar10-jpeg.zip", _ZIP), ("cifar10", _FOLDER), (".", _FOLDER), ("cifar10.zip", _ZIP),
         ("cifar-10-batches-py", _CIFAR10_PICKLES)),
        "CIFAR10",
    ),
    "cifar100": _Spec(
        "CIFAR-100", 100,
        (("cifar100-images.zip", _ZIP), ("cifar100", _FOLDER), (".", _FOLDER), ("cifar100.zip", _ZIP),
         ("cifar-100-python", _CIFAR100_PICKLES)),
        "CIFAR100",
    ),
    "femnist": _Spec("FEMNIST", 62, (("femnist-leaf-sample.npz", (Path.is_file, _read_femnist)),), augmentable=False),
    # data.root names the image folder or its zip itself.
    "imagefolder": _Spec("image-folder data set", None, ((".", _ZIP), (".", _FOLDER))),
    "synthetic": _synthetic,
}


def _find_source(spec: _Spec, root: Path, download: bool) -> tuple[Path, Callable[[Path], Arrays]]:
    for rel, (looks_ok, read) in spec.candidates:
        path = (root / rel).resolve()
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
    looked = ", ".join("a zip at the root itself" if rel == "." and reader is _ZIP
                       else "train/ + test/ image folders" if rel == "."
                       else rel if reader[0] is Path.is_file else rel + "/"
                       for rel, reader in spec.candidates)
    online = ", or data.download: true when online" if spec.torchvision_class else ""
    raise DataError(f"data.root: no {spec.title} found under {root} (looked for {looked}); set data.root or "
                    f"FEDSIM_DATA to the folder holding it{online}")


# ---------------------------------------------------------------------------------------------
# Cache: <cache_dir>/<name>-<key>/{train_x,train_y,test_x,test_y}.npy + meta.json
# (+ {train_groups,test_groups}.npy when the source has per-sample client ids)


def _source_key(source: Path) -> str:
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


def _channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
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


def _open_cache(name: str, folder: Path, spec: _Spec) -> ArrayDataset | None:
    """The cached data set, or None when the folder is missing or damaged (then it is rebuilt)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        arrays = [np.load(folder / f"{a}.npy", mmap_mode="r", allow_pickle=False)
                  for a in _ARRAYS + (_GROUPS if meta.get("groups") else ())]
        train_x, train_y, test_x, test_y, *groups = arrays
        # A constant channel (std 0) would divide by zero: left unscaled it is just 0 after centring.
        std = tuple(float(s) if s > 0 else 1.0 for s in meta["std"])
        dataset = ArrayDataset(name, train_x, train_y, test_x, test_y, tuple(meta["classes"]),
                               tuple(meta["mean"]), std, *groups, augmentable=spec.augmentable,
                               digest=meta.get("digest") or content_digest(*arrays))  # caches from before digests
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


def recomputed_digest(data: ArrayDataset) -> str:
    """The content hash of what training reads, from the arrays themselves (not a cache's record of it)."""
    return content_digest(*(getattr(data, a) for a in _ARRAYS + _GROUPS if getattr(data, a) is not None))


def _build_cache(folder: Path, source: Path, read: Callable[[Path], Arrays], spec: _Spec) -> None:
    arrays = read(source)
    if spec.num_classes is not None and len(arrays.classes) != spec.num_classes:
        raise DataError(f"data.root: {source} has {len(arrays.classes)} classes but {spec.title} has "
                        f"{spec.num_classes}; point data.root at the right data set")
    mean, std = _channel_stats(arrays.train_x)
    has_groups = arrays.train_groups is not None
    names = _ARRAYS + (_GROUPS if has_groups else ())
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target under a name of our own, then rename: no reader ever sees a half-written cache.
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared
        for a in names:
            np.save(tmp / f"{a}.npy", getattr(arrays, a))
        meta = {"classes": list(arrays.classes), "mean": mean, "std": std, "source": str(source), "groups": has_groups,
                "digest": content_digest(*(getattr(arrays, a) for a in names))}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        _publish(tmp, folder, spec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, folder: Path, spec: _Spec) -> None:
    """Rename ``tmp`` to ``folder`` unless another process got there first. A folder already in place is
    only moved aside (then deleted) when it is damaged, and only if it is still damaged right before:
    a cache another process just published, and may be reading, is never removed."""
    if folder.exists() and _open_cache(folder.name, folder, spec) is None:
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


def _user_dataset(name: str, root: str | Path | None, options: dict) -> ArrayDataset:
    """``data.dataset: package.module:function``, called as function(root, options) -> ArrayDataset."""
    try:
        dataset = load_plugin(name, "data.dataset")(root, options)
    except PluginError as err:
        raise DataError(str(err)) from None
    if not isinstance(dataset, ArrayDataset):
        raise DataError(f"data.dataset: {name!r} returned a {type(dataset).__name__}; return a "
                        "fedsim.data.ArrayDataset")
    # A resumed run compares the data with what it started on: a user's data set gets its content hash too.
    return dataset if dataset.digest else dataclasses.replace(dataset, digest=recomputed_digest(dataset))


def load_dataset(name: str, root: str | Path | None = None, download: bool = False,
                 options: dict | None = None) -> ArrayDataset:
    """Load a data set by name from ``root`` (or FEDSIM_DATA), decoding only on first use.

    Generated data sets (synthetic) need no root and take their parameters from ``options``;
    the others ignore it.
    """
    if is_plugin(name):
        return _user_dataset(name, root, options or {})
    spec = _DATASETS.get(name)
    if spec is None:
        raise DataError(f"data.dataset: unknown data set {name!r}; choose one of {', '.join(_DATASETS)} "
                        "or give 'package.module:function'")
    if not isinstance(spec, _Spec):
        return spec(options or {})
    source, read = _find_source(spec, resolve_root(root), download)
    folder = cache_dir() / f"{name}-{_source_key(source)}"
    dataset = _open_cache(name, folder, spec)
    if dataset is None:
        _build_cache(folder, source, read, spec)
        dataset = _open_cache(name, folder, spec)
    if dataset is None:
        raise DataError(f"FEDSIM_CACHE: could not build a usable cache at {folder}; delete it or point "
                        "FEDSIM_CACHE at a writable folder")
    return dataset
