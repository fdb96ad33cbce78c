"""Packed training (engine.pack) on a worker: its clients trained a pack at a time, each running its algorithm's own
client hook on a :class:`~fedsim.client.packed_client.PackedClient`, the hooks in lockstep, the local training of
all that ask for it at once (:class:`~fedsim.client.packed_trainer.PackedTrainer`)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from fedsim.algorithms.context import PackablePort
from fedsim.client.lockstep import LockstepThread, in_lockstep
from fedsim.client.packed_client import PackedClient
from fedsim.client.packed_trainer import PackedTrainer, TrainRequest
from fedsim.client.packsize import choose_pack_size
from fedsim.client.reduce import Trained
from fedsim.client.setup import WorkerModel

RunClient = Callable[[int, PackablePort], Trained]  # a client's hook, run on the given port


class Packing:
    """A worker's packs: their size, and the one trainer that runs their local training."""

    def __init__(self, model: WorkerModel, size: int | str, method: str, batch_size: int, augment: bool,
                 input_shape: tuple[int, ...], gpu_fraction: float):
        self.model, self.method = model, method
        self.batch_size, self.augment = batch_size, augment
        self.input_shape, self.gpu_fraction = input_shape, gpu_fraction
        # Packed kernels on a CPU run in channels_last whatever engine.memory_format says: in the contiguous layout a
        # client's result was measured to depend on its place in the pack (docs/packed.md).
        self.trainer = PackedTrainer(model.net, model.layouts["full"].keys, model.parameter_keys,
                                     model.channels_last or model.device.type == "cpu")
        self._size = size  # engine.pack: a number of clients, or auto until measured

    def size(self) -> int:
        """engine.pack, or for auto: measured once on this worker's device (fedsim.client.packsize); never changes
        results, since any pack size >= 2 computes the same."""
        if isinstance(self._size, str):  # auto
            self._size = choose_pack_size(self.trainer, self.model, self.input_shape, self.batch_size,
                                          self.gpu_fraction)
        return self._size

    def train(self, worker: PackablePort, clients: list[int], run: RunClient) -> Iterator[Trained]:
        """Each client's round, in order, a pack at a time: ``run`` on a packed client of ``worker``."""
        size = self.size()
        for start in range(0, len(clients), size):
            yield from in_lockstep([self._hook(worker, client, run) for client in clients[start:start + size]],
                                   self._serve)

    def _hook(self, worker: PackablePort, client: int, run: RunClient) -> Callable[[LockstepThread], Trained]:
        def on_thread(thread: LockstepThread) -> Trained:
            return run(client, PackedClient(worker, self.model.layouts, self.model.parameter_keys, self.method,
                                            thread))
        return on_thread

    def _serve(self, requests: list[TrainRequest]) -> list[list[torch.Tensor]]:
        """Local training for every parked client of a pack, those asking for the same update together."""
        losses: dict[int, list[torch.Tensor]] = {}
        by_kind: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            by_kind.setdefault(r.kind, []).append(i)
        m = self.model
        for (parts, _, round_idx), members in by_kind.items():
            trained = m.trainable(parts)
            hyper = {k: m.settings.sgd(m.part_of[k], round_idx) for k in trained}
            got = self.trainer.fit([requests[i] for i in members], trained, hyper, self.batch_size, self.augment)
            losses |= dict(zip(members, got))
        return [losses[i] for i in range(len(requests))]
