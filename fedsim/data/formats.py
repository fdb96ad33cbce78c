"""The on-disk formats a data set is read from: image folders and their zips, the CIFAR pickle batches and
LEAF's FEMNIST sample, each turned into the same ``Arrays``."""

from __future__ import annotations

import io
import pickle
import re
import string
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from fedsim.errors import DataError


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


def _class_images(root: Path) -> list[tuple[str, str]]:
    """(class folder, member) of every image in ``root/<class>/`` (torchvision's ImageFolder layout)."""
    return [(p.parent.name, p.relative_to(root).as_posix()) for p in root.glob("*/*")
            if p.is_file() and _is_image(p.relative_to(root).as_posix())]


def _holds_class_folders(root: Path) -> bool:
    return root.is_dir() and not (root / "train").is_dir() and any(True for _ in _class_images(root))


def _read_class_folders(root: Path) -> Arrays:
    """``root/<class>/`` images with no train/test split: all of them as training data and an empty test set,
    which data.test_split splits off per class from the run's seed (``fedsim.data.datasets.split_test``)."""
    files = sorted(_class_images(root))  # sorted: same order on every OS
    classes = tuple(sorted({c for c, _ in files}))
    index = {c: i for i, c in enumerate(classes)}
    x = _decode_images(root, [m for _, m in files], lambda member: (root / member).read_bytes())
    y = np.array([index[c] for c, _ in files], np.int64)
    return Arrays(x, y, x[:0], y[:0], classes)


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


# The formats the data set registry (fedsim.data.datasets) looks for under the data root.
IMAGE_ZIP: Reader = (Path.is_file, _read_image_zip)
IMAGE_FOLDER: Reader = (lambda p: (p / "train").is_dir(), _read_image_folder)
CLASS_FOLDERS: Reader = (_holds_class_folders, _read_class_folders)  # no test set: data.test_split makes one
CIFAR10_PICKLES: Reader = (
    Path.is_dir,
    _pickle_reader([f"data_batch_{i}" for i in range(1, 6)], "test_batch", "batches.meta", "labels", "label_names"),
)
CIFAR100_PICKLES: Reader = (
    Path.is_dir,
    _pickle_reader(["train"], "test", "meta", "fine_labels", "fine_label_names"),
)
FEMNIST_NPZ: Reader = (Path.is_file, _read_femnist)
