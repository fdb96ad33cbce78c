"""Dropping a process's resident pages of shared memory it has finished reading or writing.

Ray's object store is one shared mapping in every process of a node: a numpy array the server receives
through ``ray.get`` (or writes with ``ray.put``) is a view into it, and the pages it touched count in the
server's resident memory until released, even after Ray frees the object (measured: the server's RSS kept
every worker partial it had ever read, 2 x W x model bytes). Releasing them (MADV_DONTNEED) keeps the
data: the store still holds it, and a later read faults it back in."""
from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Callable

import numpy as np

PAGE = mmap.PAGESIZE


def release_shared(array: np.ndarray) -> None:
    """Drop this process's pages under ``array`` if it lies in a shared mapping; anything else is left alone
    (in private memory MADV_DONTNEED would discard the data), as is every system without /proc."""
    if not array.flags.c_contiguous or array.nbytes < PAGE:
        return
    start = array.__array_interface__["data"][0]
    first, last = -(-start // PAGE) * PAGE, (start + array.nbytes) // PAGE * PAGE  # whole pages inside
    if last > first and _in_shared_mapping(first, last):
        _madvise()(first, last - first, mmap.MADV_DONTNEED)


def _in_shared_mapping(first: int, last: int) -> bool:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split(maxsplit=2)[:2]
                low, high = (int(x, 16) for x in span.split("-"))
                if low <= first and last <= high:
                    return perms[3] == "s"
    except OSError:
        pass
    return False


@functools.cache
def _madvise() -> Callable[[int, int, int], int]:
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise
