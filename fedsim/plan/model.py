"""The run's round-0 model as the plan carries it: flat vectors and their layouts, built once from the seed on the
driver (:func:`fedsim.plan.build.build_model_plan`).

This module imports no torch: the server's process receives the plan too."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.core.layout import KeyParts, Layout


@dataclass(frozen=True)
class ModelPlan:
    """The run's round-0 model as flat vectors: built once from the seed (and model.init_from), so every
    worker starts from exactly these values instead of building and initialising its own."""
    layouts: dict[str, Layout]  # "shared" (what the server holds), "personal" (the rest), "full" (everything)
    initial: dict[str, np.ndarray]  # each layout's round-0 values
    keys: KeyParts  # the body/head split (model.parts, model.head or model.personal_layers) and the BatchNorm keys
    parameters: int  # trainable parameters of the whole model
    state_bytes: int  # the whole state dict (buffers included), as stored
    client: str  # the client module: model.client, or the built-in FedClient around model.name
    optimizers: tuple[str, ...]  # its optimizers' param groups with the parts they train (``--dry-run`` prints them)
    own_optimizers: bool  # from the module's configure_optimizers (else fedsim's, from train.body / train.head)
    buffers: frozenset[str] = frozenset()  # state-dict keys that are statistics, not parameters (BatchNorm's)
    unpackable: str | None = None  # why the client module cannot be trained packed (engine.pack), or None
    frozen: int = 0  # values the network holds that never train or travel (minilm's pretrained encoder)
