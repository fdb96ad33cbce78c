"""``model.parts``: a network's body and head named by patterns over its state-dict keys, so a split that no block
index gives (LoRA's A matrices shared, its B matrices and the classifier personal) needs no code of the user's. The
methods read body and head as ever: FedPer shares the body and keeps the head, FedBABU trains the body and fixes
the head, FedAvg shares both."""
from __future__ import annotations

from fnmatch import fnmatchcase

from fedsim.config import PartsConfig
from fedsim.errors import ConfigError


def head_by_patterns(keys: list[str], parts: PartsConfig, model: str) -> list[str]:
    """The head's keys (in ``keys``' order) after checking that every pattern names a key and every key is named by
    exactly one part; ``keys``: the state-dict keys of ``model`` (what travels: frozen weights are in none)."""
    for part, patterns in (("body", parts.body), ("head", parts.head)):
        for i, pattern in enumerate(patterns):
            if not any(fnmatchcase(key, pattern) for key in keys):
                raise ConfigError(f"model.parts.{part}[{i}]: {pattern!r} names no tensor of {model} (its tensors: "
                                  f"{_some(keys)}); fix the pattern or remove it")
    head = []
    for key in keys:
        in_body = next((p for p in parts.body if fnmatchcase(key, p)), None)
        in_head = next((p for p in parts.head if fnmatchcase(key, p)), None)
        if in_body is not None and in_head is not None:
            raise ConfigError(f"model.parts: {key} is named by body {in_body!r} and by head {in_head!r}; name each "
                              "tensor in one part")
        if in_body is None and in_head is None:
            raise ConfigError(f"model.parts: {key} is named by no pattern of body or head; add a pattern that names "
                              "it to the part it belongs to")
        if in_head is not None:
            head.append(key)
    return head


def _some(keys: list[str], shown: int = 4) -> str:
    listed = ", ".join(keys[:shown])
    return listed + (f" and {len(keys) - shown} more" if len(keys) > shown else "")
