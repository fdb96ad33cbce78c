"""Where a client's randomness comes from: (seed, round, client), never the worker, so results do not depend on how
clients are spread over workers."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

TRAIN_STREAM = 0
FINETUNE_STREAM = 1  # keeps evaluation fine-tuning randomness apart from training's


GLOBAL_DRAWS = 2  # added to a stream: what torch's global generator gives in that stream's work


def _seed_of(seed: int, round_idx: int, client: int, stream: int) -> int:
    state = np.random.SeedSequence([seed, round_idx, client, stream]).generate_state(2, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def client_generator(seed: int, round_idx: int, client: int, stream: int = TRAIN_STREAM) -> torch.Generator:
    """All of a client's randomness in a round (shuffling, augmentation) for one ``stream``."""
    return torch.Generator().manual_seed(_seed_of(seed, round_idx, client, stream))


@contextmanager
def global_draws(seed: int, round_idx: int, client: int, stream: int = TRAIN_STREAM) -> Iterator[None]:
    """torch's global generator seeded from (seed, round, client, stream) for the block: what draws from it there
    (LoRA's or a user module's dropout, a module's own ``torch.rand``) does not depend on which clients its worker
    ran before. The CPU generator's state is given back afterwards, so code outside a client's work sees the
    sequence it would have; a GPU's generators are seeded too (and left so)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed_of(seed, round_idx, client, stream + GLOBAL_DRAWS))
        yield
