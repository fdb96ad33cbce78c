"""Where a client's randomness comes from: (seed, round, client), never the worker, so results do not depend on how
clients are spread over workers."""
from __future__ import annotations

import numpy as np
import torch

TRAIN_STREAM = 0
FINETUNE_STREAM = 1  # keeps evaluation fine-tuning randomness apart from training's


def client_generator(seed: int, round_idx: int, client: int, stream: int = TRAIN_STREAM) -> torch.Generator:
    """All of a client's randomness in a round (shuffling, augmentation) for one ``stream``."""
    state = np.random.SeedSequence([seed, round_idx, client, stream]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))
