"""A worker's per-client state: flat float32 vectors (a client's personal layers, its control variate, ...)
kept as rows of large blocks, in RAM up to a budget and then in memory-mapped files."""
from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator

import numpy as np

from fedsim.errors import ConfigError


def check_spill_dir(spill_dir: str | None) -> None:
    """engine.spill_dir on this machine: an existing writable folder, or a path whose nearest existing parent is one
    (a worker makes the rest). Checked before a local run starts, where a worker would otherwise find it mid-run."""
    if spill_dir is None:
        return
    path = os.path.abspath(spill_dir)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is" if existing == path else f"would be made inside {existing}, which is"
        raise ConfigError(f"engine.spill_dir: {path} {what} not a folder; point it at a folder on a local disk")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"engine.spill_dir: {existing} is not writable by this user; point it at a folder you can "
                          "write on a local disk")


class StateMemory:
    """Where a worker's per-client state blocks live: RAM up to ``ram_bytes``, then memory-mapped files in a
    folder of its own under ``spill_dir`` (the system's temp dir by default).

    A spilled file is unlinked as soon as it is mapped: the mapping keeps its data, and the kernel frees it
    when the mapping goes, even when the worker is killed. Pages of a mapping that were touched count as
    resident until released, so every ``RELEASE_BYTES`` of spilled rows read or written they are dropped
    from this process (MADV_DONTNEED); the kernel's page cache keeps or writes them back as memory allows."""

    RELEASE_BYTES = 64 << 20

    def __init__(self, ram_bytes: int, spill_dir: str | None = None):
        self.ram_left = ram_bytes
        self.spill_dir = spill_dir
        self._folder: str | None = None
        self._maps: list[mmap.mmap] = []
        self._touched = 0

    def block(self, rows: int, size: int) -> tuple[np.ndarray, bool]:
        """A new (rows, size) float32 block and whether it was spilled to disk."""
        nbytes = rows * size * 4
        if nbytes <= self.ram_left:
            self.ram_left -= nbytes
            return np.empty((rows, size), np.float32), False
        try:
            mapped = self._mapped_file(max(nbytes, 1))
        except OSError as err:
            raise ConfigError(f"engine.spill_dir: cannot keep per-client state past engine.state_ram_mb in "
                              f"{self.spill_dir or tempfile.gettempdir()} ({err.strerror}); point it at a writable "
                              "local disk with room, or raise engine.state_ram_mb") from None
        self._maps.append(mapped)
        return np.ndarray((rows, size), np.float32, buffer=mapped), True

    def _mapped_file(self, nbytes: int) -> mmap.mmap:
        if self._folder is None:
            if self.spill_dir:
                os.makedirs(self.spill_dir, exist_ok=True)
            self._folder = tempfile.mkdtemp(prefix=f"fedsim-state-{os.getpid()}-", dir=self.spill_dir)
            weakref.finalize(self, shutil.rmtree, self._folder, True)  # also at exit
        fd, path = tempfile.mkstemp(dir=self._folder, suffix=".f32")
        try:
            # Reserved now: a full disk is an error here, not a SIGBUS when a page of a sparse file is first written.
            os.posix_fallocate(fd, 0, nbytes)
            return mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
            os.unlink(path)

    def touched(self, nbytes: int) -> None:
        """Count spilled bytes read or written; past RELEASE_BYTES, drop their pages from this process."""
        self._touched += nbytes
        if self._touched >= self.RELEASE_BYTES:
            self.release()

    def release(self) -> None:
        for mapped in self._maps:
            mapped.madvise(mmap.MADV_DONTNEED)
        self._touched = 0


class VectorStore:
    """Per-client flat vectors of one length, kept as rows of large preallocated blocks.

    One small numpy array per client costs a header and its own malloc chunk, interleaved with the
    round's transient buffers: measured 10.6-13.0 KB per 10.3 KB FedPer head. Rows of ~4 MB blocks
    cost the vector alone, and untouched rows of a block cost no resident memory at all. Blocks come
    from ``memory`` (RAM up to a budget, then disk). Clients written since ``mark_saved`` are ``changed``:
    what an incremental checkpoint writes."""

    BLOCK_BYTES = 4 << 20

    def __init__(self, size: int, memory: StateMemory | None = None):
        self.size = size
        self.rows_per_block = max(1, self.BLOCK_BYTES // max(4 * size, 1))
        self.memory = memory or StateMemory(ram_bytes=1 << 62)
        self._blocks: list[np.ndarray] = []
        self._spilled: list[bool] = []
        self._row: dict[int, int] = {}  # client -> row number, in first-stored order
        self.changed: set[int] = set()

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, client: int) -> bool:
        return client in self._row

    def __getitem__(self, client: int) -> np.ndarray:
        return self._view(self._row[client])

    def get(self, client: int, default: np.ndarray) -> np.ndarray:
        return self[client] if client in self._row else default

    def __setitem__(self, client: int, vector: np.ndarray) -> None:
        if client not in self._row:
            row = self._row[client] = len(self._row)
            if row // self.rows_per_block == len(self._blocks):
                new_block, spilled = self.memory.block(self.rows_per_block, self.size)
                self._blocks.append(new_block)
                self._spilled.append(spilled)
        block, index = divmod(self._row[client], self.rows_per_block)
        self._blocks[block][index] = vector
        self.changed.add(client)
        if self._spilled[block]:
            self.memory.touched(4 * self.size)

    def items(self) -> Iterator[tuple[int, np.ndarray]]:
        return ((client, self._view(row)) for client, row in self._row.items())

    def changed_items(self) -> Iterator[tuple[int, np.ndarray]]:
        return ((client, self[client]) for client in sorted(self.changed))

    def mark_saved(self) -> None:
        self.changed.clear()

    def _view(self, row: int) -> np.ndarray:
        block, index = divmod(row, self.rows_per_block)
        view: np.ndarray = self._blocks[block][index]
        view.flags.writeable = False  # callers read; writes go through __setitem__
        if self._spilled[block]:
            self.memory.touched(4 * self.size)
        return view
