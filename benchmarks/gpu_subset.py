"""Small CIFAR-10 / CIFAR-100 zips, in the layout fedsim reads, for a machine the full data cannot reach.

    python benchmarks/gpu_subset.py SHARED_DATASETS OUT_DIR [--c10 500 200] [--c100 50 10]

takes the first TRAIN and TEST images of every class from ``cifar10-jpeg.zip`` and ``cifar100-images.zip``
(the files are copied as they are, not re-encoded, so pixels equal the full set's) and writes zips of the
same names into OUT_DIR. With the defaults: CIFAR-10 at 10% of train / 20% of test (the quickstart's own
fractions, so the quickstart runs on it with data.train_fraction=1 data.test_fraction=1) and CIFAR-100
with 50 / 10 images per class, which FedBABU's shards (s = 10, 50 images a shard) split into 10 clients of
500 training and 100 test images: the paper's clients, 10 of them (benchmarks/gpu_check.py)."""
from __future__ import annotations

import argparse
import zipfile
from collections import defaultdict
from pathlib import Path

SOURCES = {"cifar10": "cifar10-jpeg.zip", "cifar100": "cifar100-images.zip"}


def subset_members(names: list[str], per_class: dict[str, int]) -> list[str]:
    """The first ``per_class[split]`` files (in name order) of every ``split/class/`` folder."""
    by_folder: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name in names:
        parts = name.split("/")
        if len(parts) >= 3 and parts[-3] in per_class and not name.endswith("/"):
            by_folder[tuple(parts[:-1])].append(name)
    return sorted(m for folder, files in by_folder.items() for m in sorted(files)[:per_class[folder[-2]]])


def write_subset(source: Path, target: Path, train: int, test: int) -> int:
    """Copy the chosen members uncompressed (the images already are); returns how many."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as dst:
        members = subset_members(src.namelist(), {"train": train, "test": test})
        for member in members:
            dst.writestr(member, src.read(member))
    return len(members)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shared", type=Path, help="folder holding cifar10-jpeg.zip and cifar100-images.zip")
    parser.add_argument("out", type=Path)
    parser.add_argument("--c10", type=int, nargs=2, default=(500, 200), metavar=("TRAIN", "TEST"))
    parser.add_argument("--c100", type=int, nargs=2, default=(50, 10), metavar=("TRAIN", "TEST"))
    parser.add_argument("--smoke", action="store_true", help="2 + 1 CIFAR-10 and 1 + 1 CIFAR-100 images a class: "
                        "checks that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.c10, args.c100 = (2, 1), (1, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (train, test) in (("cifar10", args.c10), ("cifar100", args.c100)):
        count = write_subset(args.shared / SOURCES[name], args.out / SOURCES[name], train, test)
        print(f"{name}: {count} images -> {args.out / SOURCES[name]}")


if __name__ == "__main__":
    main()
