"""A client partition: which train and test samples each simulated client holds, its summary and its file.

Drawing one is ``fedsim.data.partitioning``'s job.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim import atomic, safe_files
from fedsim.errors import DataError


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value, compare by identity
class Partition:
    train: tuple[np.ndarray, ...]  # per client: sorted int64 indices into the train arrays
    test: tuple[np.ndarray, ...]  # per client: sorted int64 indices into the test arrays
    # Per client, int64 of length num_classes: the client's label = map[true label]. Only the
    # "conflicting" kind sets it, to give the same inputs different labels at different clients.
    label_maps: tuple[np.ndarray, ...] | None = None

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def labels(self, client: int, y: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The labels ``client`` trains or is tested on for samples ``idx`` of label array ``y``."""
        return y[idx] if self.label_maps is None else self.label_maps[client][y[idx]]

    def stats(self, train_y: np.ndarray, test_y: np.ndarray, num_classes: int) -> dict:
        """Summary for logs and run metadata; plain Python types so it serialises to JSON."""
        sizes = np.array([len(t) for t in self.train])

        def counts(y: np.ndarray, parts: tuple[np.ndarray, ...]) -> list[np.ndarray]:
            return [np.bincount(self.labels(i, y, p), minlength=num_classes) for i, p in enumerate(parts)]

        def held(y: np.ndarray, parts: tuple[np.ndarray, ...]) -> list[list[int]]:
            return [np.flatnonzero(c).tolist() for c in counts(y, parts)]

        return {
            "num_clients": self.num_clients,
            "relabelled": self.label_maps is not None,
            "train_sizes": sizes.tolist(),
            "test_sizes": [len(t) for t in self.test],
            "classes_per_client": held(train_y, self.train),
            "test_classes_per_client": held(test_y, self.test),
            "train_class_counts": [c.tolist() for c in counts(train_y, self.train)],  # W&B's partition table
            "size_mean": float(sizes.mean()),
            "size_std": float(sizes.std()),
            "size_min": int(sizes.min()),
            "size_max": int(sizes.max()),
        }

    def save(self, path: Path) -> None:
        arrays = {f"train_{i}": t for i, t in enumerate(self.train)} | {f"test_{i}": t for i, t in enumerate(self.test)}
        arrays |= {f"label_map_{i}": m for i, m in enumerate(self.label_maps or ())}
        buffer = io.BytesIO()  # a file object also stops numpy appending ".npz" to the name
        # numpy >= 2.1's stub lets **arrays fill savez's allow_pickle: bool; its keys are train_i, test_i and
        # label_map_i, and passing allow_pickle itself would store it as an array under numpy < 2.1.
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        atomic.write_bytes(Path(path), buffer.getvalue())  # a fresh temporary file renamed over it, never a link

    @classmethod
    def load(cls, path: Path) -> Partition:
        try:
            with safe_files.open_regular(path) as f, np.load(f, allow_pickle=False) as z:
                n = sum(key.startswith("train_") for key in z.files)
                train = tuple(z[f"train_{i}"].astype(np.int64) for i in range(n))
                test = tuple(z[f"test_{i}"].astype(np.int64) for i in range(n))
                maps = tuple(z[f"label_map_{i}"].astype(np.int64) for i in range(n)) if "label_map_0" in z else None
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:  # TypeError: a bare .npy
            raise DataError(f"{path}: not a readable partition file ({e}); delete it to have it rebuilt") from e
        if n == 0 or len(z.files) != (2 if maps is None else 3) * n:
            raise DataError(f"{path}: not a partition file (keys {z.files[:4]}...); delete it to have it rebuilt")
        return cls(train, test, maps)
