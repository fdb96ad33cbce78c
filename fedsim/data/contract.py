"""What every layer above assumes of a data set, checked where a user's data set enters (``data.dataset:
package.module:function``): labels class indices 0..C-1 of an integer type (stored as int64, what a loss takes),
features of one dtype (uint8 images or floats) and one sample shape (H, W, C) for train and test, and as many labels
(and groups) as samples. A violation is one line naming ``data.dataset`` and the fix, before any partition or module
sees the data: a float label would otherwise surface as the module's loss failing, a label out of range as a
partition that cannot be drawn."""
from __future__ import annotations

import dataclasses

import numpy as np

from fedsim.data.array_dataset import ArrayDataset
from fedsim.errors import DataError


def checked(dataset: ArrayDataset, name: str) -> ArrayDataset:
    """``dataset`` as the data layer holds it (labels and groups as int64); refused in one line naming ``name``
    (``data.dataset``'s value) where it breaks the contract."""
    where = f"data.dataset: {name!r} returned"
    _check_features(dataset, where)
    classes = len(dataset.classes)
    if classes < 1:
        raise DataError(f"{where} no classes; give ArrayDataset.classes, one name per class")
    for split in ("train", "test"):
        _check_labels(getattr(dataset, f"{split}_y"), len(getattr(dataset, f"{split}_x")), f"{split}_y", classes, where)
        groups = getattr(dataset, f"{split}_groups")
        if groups is not None:
            _check_labels(groups, len(getattr(dataset, f"{split}_x")), f"{split}_groups", None, where)
    # As the layers above index with them (astype keeps an int64 array as it is).
    groups = [None if g is None else g.astype(np.int64, copy=False) for g in (dataset.train_groups, dataset.test_groups)]
    return dataclasses.replace(dataset, train_y=dataset.train_y.astype(np.int64, copy=False),
                               test_y=dataset.test_y.astype(np.int64, copy=False), train_groups=groups[0],
                               test_groups=groups[1])


def _check_features(dataset: ArrayDataset, where: str) -> None:
    train, test = dataset.train_x, dataset.test_x
    for field, x in (("train_x", train), ("test_x", test)):
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            shape = getattr(x, "shape", None)
            raise DataError(f"{where} {field} shaped {shape}; give a numpy array (samples, height, width, channels), "
                            "e.g. (N, 1, 1, F) for F features")
        if x.dtype != np.uint8 and not np.issubdtype(x.dtype, np.floating):
            raise DataError(f"{where} {field} of dtype {x.dtype}; give uint8 images or float32 features")
    if train.dtype != test.dtype or train.shape[1:] != test.shape[1:]:
        raise DataError(f"{where} train_x of {train.dtype} {train.shape[1:]} and test_x of {test.dtype} "
                        f"{test.shape[1:]}; give both splits one dtype and one sample shape (height, width, channels)")
    channels = train.shape[3]
    if len(dataset.mean) != channels or len(dataset.std) != channels:
        raise DataError(f"{where} mean and std of {len(dataset.mean)} and {len(dataset.std)} values for {channels} "
                        "channels; give one value per channel")


def _check_labels(labels: np.ndarray, samples: int, field: str, classes: int | None, where: str) -> None:
    """Integer indices, one per sample, each below ``classes`` (None: groups, any index from 0)."""
    if not isinstance(labels, np.ndarray) or labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        kind = f"dtype {labels.dtype} shaped {labels.shape}" if isinstance(labels, np.ndarray) else type(labels).__name__
        raise DataError(f"{where} {field} of {kind}; give a 1-D array of integer class indices, e.g. "
                        f"{field}.astype(np.int64)")
    if len(labels) != samples:
        raise DataError(f"{where} {len(labels)} values of {field} for {samples} samples; give one per sample")
    if not len(labels):
        return
    low, high = int(labels.min()), int(labels.max())
    if classes is None and low < 0:
        raise DataError(f"{where} {field} from {low}; give group indices from 0")
    if classes is not None and (low < 0 or high >= classes):
        raise DataError(f"{where} {field} from {low} to {high}, outside 0..{classes - 1} (its {classes} classes); map "
                        "the labels to 0..C-1 and list C names in classes")
