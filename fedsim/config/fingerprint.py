"""Which settings change what a run computes (:func:`result_settings`), and the fingerprint a checkpoint must match
to continue a run (:func:`resume_fingerprint`). Settings added after checkpoints were first written sit in the
``LATER_*`` tables (and ``SYSTEM_OFF``, ``SERVER_MEAN``): at their legacy defaults they leave a fingerprint as it
was, so older run folders keep resuming."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from fedsim.config.execution import SystemConfig
from fedsim.config.learning import ServerConfig
from fedsim.config.partition import FLAT_PARTITION_KEYS


# Where a run writes, how it logs and its sweep never change its results; of the engine settings only these
# do (they change floating-point results in the last bits). Everything else does.
NOT_RESULTS = ("name", "out_dir", "sweep", "search", "tune", "logging")
ENGINE_RESULTS = ("threads_per_worker", "memory_format")


def result_settings(cfg_dict: dict) -> dict:
    """The settings of a resolved config (``RunConfig.model_dump()``) that change what the run computes."""
    settings = {k: v for k, v in cfg_dict.items() if k not in NOT_RESULTS}
    settings["engine"] = {k: v for k, v in settings["engine"].items() if k in ENGINE_RESULTS}
    # Packed training changes the last bits (other kernels); its pack size never does (docs/packed.md).
    settings["engine"]["packed"] = cfg_dict["engine"].get("pack", 1) != 1
    # Added later: at their defaults (no privacy section, fixed-size sampling) a run's settings read as they did.
    if settings.get("privacy", ...) is None:
        del settings["privacy"]
    if settings.get("train", {}).get("sampling") == "fixed":
        settings["train"] = {k: v for k, v in settings["train"].items() if k != "sampling"}
    return settings


# data.partition settings added after the flat keys, (kind, name) -> default: at it, a fingerprint stays as it was.
LATER_PARTITION_DEFAULTS = {("conflicting", "agreed"): 0.0}


def _flat_partition(data: dict) -> dict:
    """The data section as fedsim wrote it before partitions were typed (its flat keys at their old defaults
    where another kind's), so that checkpoints written then keep their fingerprint."""
    partition = data["partition"]
    flat: dict[str, Any] = {k: v for k, v in data.items() if k != "partition"} | {"partition": partition["name"]}
    for key, (kind, name, default) in FLAT_PARTITION_KEYS.items():
        flat[key] = partition[name] if partition["name"] == kind else default
    for (kind, name), default in LATER_PARTITION_DEFAULTS.items():
        if partition["name"] == kind and partition.get(name, default) != default:
            flat[f"partition.{name}"] = partition[name]  # flattened as data.partition.NAME in changed_settings
    return flat


# Sections and keys added after checkpoints were first written: at these defaults they leave a fingerprint as it was.
SYSTEM_OFF = SystemConfig().model_dump()  # an ideal federation
SERVER_MEAN = ServerConfig().model_dump()  # the exact mean
LATER_EVAL_DEFAULTS = {"unseen": None, "personalize": "finetune"}
LATER_DATA_DEFAULTS = {"validation": 0.0, "test_split": None}
# Async-only keys added later: a synchronous run at their defaults keeps its fingerprint (an async run does not:
# before them, FedBuff weighted reports by samples, and its checkpoints mean that).
LATER_ASYNC_DEFAULTS: dict[str, Any] = {"server_momentum": 0.0, "async_weighting": "uniform"}

LATER_MODEL_DEFAULTS: dict[str, Any] = {"client_args": {}, "head": None, "callbacks": [], "precision": "32",
                                        "client_loop": "fabric", "options": {}, "parts": None}


def _resume_settings(cfg_dict: dict) -> dict:
    """``result_settings`` less what a resume may change: a resumed run may be extended (train.rounds),
    unless a step schedule places its milestones by the round count or DP's noise is calibrated to spend
    privacy.target_epsilon over it (more rounds, another noise multiplier than the rounds already run had)."""
    settings = result_settings(cfg_dict)
    settings["data"] = {k: v for k, v in _flat_partition(settings["data"]).items() if LATER_DATA_DEFAULTS.get(k, ...) != v}
    settings["model"] = {k: v for k, v in settings["model"].items() if LATER_MODEL_DEFAULTS.get(k, ...) != v}
    settings["eval"] = {k: v for k, v in settings["eval"].items() if LATER_EVAL_DEFAULTS.get(k, ...) != v}
    if not settings["engine"]["packed"]:  # added later: an unpacked run keeps the fingerprint it had
        del settings["engine"]["packed"]
    if settings["system"] == SYSTEM_OFF:  # added later: an ideal federation keeps the fingerprint it had
        del settings["system"]
    if settings.get("system", {}).get("mode") == "sync":
        settings["system"] = {k: v for k, v in settings["system"].items() if LATER_ASYNC_DEFAULTS.get(k, ...) != v}
    if settings.get("server") == SERVER_MEAN:  # added later: the exact mean keeps the fingerprint it had
        del settings["server"]
    stepped = any(settings["train"][part]["schedule"] != "constant" for part in ("body", "head"))
    privacy = settings.get("privacy") or {}
    calibrated = privacy.get("target_epsilon") is not None and privacy.get("noise_multiplier") is None
    settings["train"] = {k: v for k, v in settings["train"].items() if k != "rounds" or stepped or calibrated}
    return settings


def results_fingerprint(cfg_dict: dict) -> str:
    """What a run's results depend on, all of it (train.rounds included): a sweep's ledger entry counts only for
    a run whose settings still have it."""
    return hashlib.sha256(json.dumps(result_settings(cfg_dict), sort_keys=True, default=str).encode()).hexdigest()[:16]


def resume_fingerprint(cfg_dict: dict) -> str:
    """What a checkpoint must match to continue this run."""
    return hashlib.sha256(json.dumps(_resume_settings(cfg_dict), sort_keys=True, default=str).encode()).hexdigest()[:16]


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """A nested settings tree as dotted keys (an empty mapping stays a value)."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Every setting added after run folders were first written, as a dotted key -> the value a config.yaml written
# before it existed means (its legacy default): such a config lacks the key and ran as if it held this value.
LATER_DEFAULTS: dict[str, object] = flatten({
    "data": {**LATER_DATA_DEFAULTS,
             "partition": {name: default for (_, name), default in LATER_PARTITION_DEFAULTS.items()}},
    "model": LATER_MODEL_DEFAULTS, "eval": LATER_EVAL_DEFAULTS, "system": SYSTEM_OFF, "server": SERVER_MEAN,
    "train": {"sampling": "fixed"}, "privacy": None})


def changed_settings(before: dict, after: dict) -> list[str]:
    """Dotted keys a resume may not change whose values differ between two resolved configs."""
    old, new = flatten(_resume_settings(before)), flatten(_resume_settings(after))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
