"""What the server holds between rounds, and what a checkpoint keeps of it: the method's server state (the global
weights among it), FedBuff's older models, DP's adaptive clip norm, how often each client has trained, and the
last checkpoint with the chain of bases the next delta checkpoint builds on.

This module imports no torch (the server's process does not)."""
from __future__ import annotations

import numpy as np

from fedsim import storage
from fedsim.core import checkpoint
from fedsim.core.protocol import WEIGHTS
from fedsim.engine.fedbuff import FedBuff
from fedsim.errors import CheckpointError
from fedsim.plan import RunPlan
from fedsim.privacy.mechanism import ServerPrivacy

Signature = dict[str, tuple[tuple[int, ...], np.dtype]]


def _signature(state: dict[str, np.ndarray]) -> Signature:
    return {name: (v.shape, v.dtype) for name, v in state.items()}


class ServerState:
    """The server's state across rounds and its checkpoints. ``values`` is the method's server state, replaced
    whole by each round's update; the rest of what a checkpoint's ``server.npz`` holds is FedBuff's and DP's."""

    def __init__(self, plan: RunPlan, fedbuff: FedBuff, privacy: ServerPrivacy):
        self.plan = plan
        self.fedbuff = fedbuff  # asynchronous rounds: the older models clients still train from
        self.privacy = privacy  # user-level DP: the clip norm and the noise on the mean
        self.values = plan.initial_server_state()
        # What a checkpoint's server state must match: entries, shapes and types, never the round-0 values.
        self.signature = _signature(self.values)
        self.times_sampled = np.zeros(plan.num_clients, np.int64)
        self.last_checkpoint: str | None = None
        self.last_chain: list[list[str]] = []  # the last checkpoint's bases and itself: what the next delta builds on

    def next_bases(self) -> list[list[str]]:
        """The checkpoints the next one is a delta of (none: it is written in full)."""
        return checkpoint.next_bases(self.last_chain, self.plan.cfg.engine.full_checkpoint_every)

    def save(self, staging: str, round_idx: int, bases: list[list[str]], workers: dict[str, str],
             recoveries: int) -> str:
        """Publish the checkpoint staged at ``staging`` once the workers wrote their files (``workers``: file name ->
        digest): the server's own state beside them, and the metadata a resume checks."""
        meta = {"fingerprint": self.plan.fingerprint, "partition": self.plan.partition_digest,
                "recoveries": recoveries, "digests": workers, **checkpoint.new_links(bases)}
        kept = ({name: v for name, v in self.values.items() if name != WEIGHTS} | self.fedbuff.checkpointed()
                | self.privacy.checkpointed())
        self.last_checkpoint = checkpoint.finish(staging, round_idx, self.values[WEIGHTS], meta, list(workers), kept)
        self.last_chain = checkpoint.links_of(meta, storage.parent_and_name(self.last_checkpoint)[1])
        return self.last_checkpoint

    def load(self, ckpt: str | None) -> int:
        """The server's state as ``ckpt`` holds it (None: round 0's, built again from the seed), which becomes the
        checkpoint a lost worker rolls back to. Returns its round."""
        if ckpt is None:
            round_idx, self.values, self.last_chain = 0, self.plan.initial_server_state(), []
            self.fedbuff.restore({})  # round 0: no older model is held
            self.privacy.restore({})  # and the initial clip norm
        else:
            with storage.local_folder(ckpt) as local:
                meta, global_vector, kept = checkpoint.read_state(local, self.plan.fingerprint,
                                                                  self.plan.model.initial["shared"].size)
            round_idx = int(meta["round"])
            rest = self.fedbuff.restore(self.privacy.restore(kept))
            self.values = self._checked(ckpt, {WEIGHTS: global_vector, **rest})
            self.last_chain = checkpoint.links_of(meta, storage.parent_and_name(ckpt)[1])
        self.times_sampled = self._times_sampled_until(round_idx)
        self.last_checkpoint = ckpt
        return round_idx

    def _checked(self, ckpt: str, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A checkpoint's server state, refused unless it holds exactly the entries, shapes and types this method's
        server starts with (a checkpoint is input: an edited server.npz must not change what the run computes)."""
        expected, found = self.signature, _signature(state)
        if found != expected:
            wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))[0]
            raise CheckpointError(f"{ckpt}: server state {wrong!r} is {found.get(wrong, 'missing')}, this "
                                  f"run's server holds {expected.get(wrong, 'no such entry')}; resume with "
                                  "the run's own config, or delete the checkpoint")
        return state

    def _times_sampled_until(self, round_idx: int) -> np.ndarray:
        counts = np.zeros(self.plan.num_clients, np.int64)
        for r in range(1, round_idx + 1):  # sampling is a function of (seed, round): recomputed, not stored
            counts[self.plan.sampled(r)] += 1
        return counts
