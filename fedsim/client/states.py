"""A worker's per-client state: each client's named slots (always ``personal``: the part of the model that is not
shared), kept between rounds in one memory budget, and written to and restored from checkpoints (personal state
never reaches the server)."""
from __future__ import annotations

import numpy as np

from fedsim import storage
from fedsim.config import EngineConfig
from fedsim.core.checkpoint import local_checkpoint, worker_vectors, write_worker_state
from fedsim.core.store import StateMemory, VectorStore
from fedsim.errors import CheckpointError


class ClientStates:
    """The slots of a worker's clients, by slot name: one :class:`VectorStore` each."""

    def __init__(self, sizes: dict[str, int], engine: EngineConfig, clients: set[int]):
        self.sizes = sizes
        self.engine = engine
        self.clients = clients
        self.slots = self._empty()

    def _empty(self) -> dict[str, VectorStore]:
        spill = self.engine.spill_dir
        memory = StateMemory(int(self.engine.state_ram_mb * 2**20),  # one budget for all slots
                             None if spill is None else storage.anchored(spill))
        return {name: VectorStore(size, memory) for name, size in self.sizes.items()}

    def stored(self, slot: str, client: int) -> np.ndarray | None:
        store = self.slots[slot]
        return store[client] if client in store else None

    def keep(self, client: int, staged: dict[str, np.ndarray]) -> None:
        """A client's round counts: its staged slots become its state."""
        for name, vector in staged.items():
            self.slots[name][client] = vector

    def save(self, target: str, full: bool = True) -> str:
        """Write the clients' slots to ``target`` (a local path, or a URI in the run's object store): all of them,
        or (``full=False``) those changed since the checkpoint last written or loaded. Returns the file's digest,
        which the checkpoint's state.json records."""
        with storage.local_output(target) as path:
            digest = write_worker_state(path, self.slots if full else {name: dict(store.changed_items())
                                                                       for name, store in self.slots.items()})
        for store in self.slots.values():
            store.mark_saved()
        return digest

    def load(self, ckpt: str | None) -> None:
        """Restore the clients' slots from a checkpoint (None: the round-0 state; a URI is downloaded)."""
        self.slots = self._empty()
        with local_checkpoint(ckpt) as local:
            for name, client, vector in worker_vectors(local, self.clients) if local else ():
                store = self.slots.get(name)
                if store is None or vector.size != store.size:
                    raise CheckpointError(f"{ckpt}: per-client state {name!r} does not fit this model and algorithm; "
                                          "resume with the run's own config")
                store[client] = vector
        for store in self.slots.values():
            store.mark_saved()  # equal to the checkpoint: the next delta builds on it
