"""What bringing one run to completion takes, read from its folder (finished, resumable, changed or new), and the
lock that lets several processes share one runs folder with each run trained by one of them."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedsim import storage, strict_yaml
from fedsim.config import RunConfig
from fedsim.core import runfiles
from fedsim.engine.runlock import open_lock_file
from fedsim.errors import ConfigError, YamlError
from fedsim.plugins import plugin_settings


def location(cfg: RunConfig) -> str:
    return storage.join(cfg.out_dir, cfg.name)


def status(cfg: RunConfig) -> str:
    """finished | resumable | changed | new: what the run folder ``cfg`` names holds against ``cfg`` (finished: its
    summary records the config's rounds, :func:`finished_summary`). The folder's
    config is input: read with the strict loader, and a plug-in it names that ``cfg`` does not is a change
    (never imported)."""
    where = location(cfg)
    store = storage.Store(where)
    if not store.exists(runfiles.CONFIG):
        return "new"
    try:
        tree = strict_yaml.load(store.read_bytes(runfiles.CONFIG).decode())
    except (YamlError, UnicodeDecodeError) as err:
        raise ConfigError(f"{storage.join(where, runfiles.CONFIG)}: not a fedsim config ({err}); remove the run folder "
                          "to run it again") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{storage.join(where, runfiles.CONFIG)}: not a fedsim config; remove the run folder to run it "
                          "again")
    if plugin_settings(tree) != plugin_settings(cfg.model_dump()):
        return "changed"
    try:
        stored, changed = runfiles.compare_stored(tree, cfg)
    except ConfigError as err:
        raise ConfigError(f"{storage.join(where, runfiles.CONFIG)}: {err}; remove the run folder to run it again") from None
    if changed:
        return "changed"
    if stored.train.rounds != cfg.train.rounds:
        return "resumable"  # a constant-lr run that is extended (the engine accepts that)
    return "finished" if finished_summary(cfg) is not None else "resumable"


def finished_summary(cfg: RunConfig) -> dict | None:
    """The run's summary.json when it records the config's train.rounds: a summary that exists is not enough (a run
    extended by a resume that then broke keeps the shorter run's summary until it ends). None for a summary that is
    missing, unreadable or of another round count."""
    store = storage.Store(location(cfg))
    if not store.exists(runfiles.SUMMARY):
        return None
    try:
        summary = json.loads(store.read_bytes(runfiles.SUMMARY))
    except (ValueError, UnicodeDecodeError):
        return None
    return summary if isinstance(summary, dict) and summary.get("rounds") == cfg.train.rounds else None


def _locks_folder(cfg: RunConfig) -> Path:
    """Beside the run folders for a local out_dir (a run started again replaces its folder, never its lock);
    for a bucket, a folder of this machine named for it (the lock guards the processes of one machine)."""
    if not storage.is_uri(cfg.out_dir):
        return Path(cfg.out_dir) / ".locks"
    return Path("~/.cache/fedsim/locks").expanduser() / hashlib.sha256(cfg.out_dir.encode()).hexdigest()[:16]


@contextmanager
def claimed(cfg: RunConfig) -> Iterator[bool]:
    """Whether this process may work on the run ``cfg`` names: an exclusive lock per run. The operating system
    frees the lock when its process ends, so a crashed process never leaves a run blocked."""
    locks = _locks_folder(cfg)
    locks.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(locks / f"{cfg.name}.lock")  # never truncated: another process may hold it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock
