"""Atomic, code-free checkpoints: numpy ``.npy``/``.npz`` (loaded with ``allow_pickle=False``) plus JSON.

Layout of ``RUN/checkpoints/``::

    round-0005/state.json     round, config fingerprint, shared-vector size, worker files
    round-0005/global.npy     global shared weights
    round-0005/server.npz     the algorithm's other server state (momentum, control variates), if any
    round-0005/worker-1.npz   per-client state of the clients worker 1 owned (``<slot>.<client>``)
    latest                    name of the newest complete checkpoint

Per-client state is incremental: a full snapshot every ``engine.full_checkpoint_every`` checkpoints, and in
between, worker files holding only the clients changed since the previous checkpoint. ``state.json`` names
the checkpoints a delta builds on (``bases``: the full snapshot first, with the random ``id`` each had when it
was written, so a base rewritten since - a run redoing rounds - is never mixed in); restoring applies them
in order. Pruning keeps the bases of every kept checkpoint.

In an object store (``out_dir: s3://...``) there is no rename: the round's files are written in
place, each in one request (workers upload their own), and ``latest`` is written last, so a reader
never follows it to a partial checkpoint (``begin``/``finish`` pick the way by location).

On a local disk, a checkpoint folder is built under a temporary name, every file fsynced, then renamed into
place; ``latest`` is replaced atomically afterwards. A crash at any moment leaves the previous
checkpoint intact. Personal weights are written by the worker that owns them and never pass
through the driver. Old checkpoints are pruned by round number (names sort wrongly from round
10,000 on), never the one ``latest`` names; when ``latest`` is missing or names a damaged
checkpoint, resume falls back to the newest intact one.

One file over ~350 lines on purpose: writing, publishing, finding, reading and pruning checkpoints are one job, the
format above, and each part keeps what the others rely on (``latest`` written last, the ``bases`` chain with its
ids, a base kept while a kept checkpoint names it); split, the rules a reader trusts would sit apart from the writer
that keeps them.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim import safe_files, storage
from fedsim.atomic import space_named
from fedsim.core.runfiles import CHECKPOINTS
from fedsim.errors import CheckpointError

if TYPE_CHECKING:
    from fedsim.core.store import VectorStore

KEEP = 2  # complete checkpoints kept on disk


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_all(run_dir: Path) -> None:
    """Every checkpoint of a run folder (a run started again with --overwrite)."""
    shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)


def staging_dir(run_dir: Path, round_idx: int) -> Path:
    path = run_dir / CHECKPOINTS / f".tmp-round-{round_idx:04d}"
    safe_files.refuse_linked_folder(path, run_dir)  # a linked checkpoints/ would have its target written and pruned
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def file_digest(path: Path) -> str:
    """sha256 of a checkpoint file, recorded in its state.json and checked before a resume uses it."""
    h = hashlib.sha256()
    with safe_files.open_regular(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_worker_state(path: Path, slots: Mapping[str, VectorStore | Mapping[int, np.ndarray]]) -> str:
    """An ``.npz`` of ``<slot>.<client>`` arrays, as ``np.savez`` writes it, but one row read at a time: a store
    that spilled to disk then pages its rows in and out as it goes instead of all at once. Returns its digest."""
    needed = sum(vector.nbytes for store in slots.values() for _, vector in store.items())
    with space_named(path, needed), open(path, "wb") as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, store in slots.items():
                for client, vector in store.items():
                    with archive.open(f"{name}.{client}.npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, vector, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return file_digest(path)


def worker_vectors(ckpt: Path, clients: set[int]) -> Iterator[tuple[str, int, np.ndarray]]:
    """(slot, client, vector) for ``clients`` from every worker file of ``ckpt``'s chain, oldest first: a later
    vector of a client replaces an earlier one. One vector at a time, so state larger than RAM streams
    into a spilling store. Ownership may differ from the writers'."""
    for folder in chain(ckpt):
        for path in sorted(folder.glob("worker-*.npz")):
            try:
                with safe_files.open_regular(path) as f, np.load(f, allow_pickle=False) as z:
                    for key in z.files:
                        name, _, client = key.rpartition(".")
                        if int(client) in clients:
                            yield name, int(client), z[key]
            except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
                raise CheckpointError(f"{path}: unreadable checkpoint file ({err}); resume again: it falls back to an "
                                      "earlier intact checkpoint")


def read_worker_states(ckpt: Path, clients: set[int]) -> dict[str, dict[int, np.ndarray]]:
    """Slot -> client -> vector for ``clients``, as ``worker_vectors`` streams them."""
    slots: dict[str, dict[int, np.ndarray]] = {}
    for name, client, vector in worker_vectors(ckpt, clients):
        slots.setdefault(name, {})[client] = vector
    return slots


def _load_array(path: Path) -> np.ndarray:
    with safe_files.open_regular(path) as f:
        array: np.ndarray = np.load(f, allow_pickle=False)
        return array


def _state_json(ckpt: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(safe_files.read_text(ckpt / "state.json"))
        return state
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{ckpt}: truncated or unreadable checkpoint ({err}); resume again: it falls back to "
                              "an earlier intact checkpoint") from None


def chain(ckpt: Path) -> list[Path]:
    """The folders that rebuild ``ckpt``'s per-client state, in order: its full snapshot, the deltas after it, itself."""
    folders = []
    for name, ident in _state_json(ckpt).get("bases", []):
        base = ckpt.parent / name
        if not (base / "state.json").is_file() or _state_json(base).get("id") != ident:
            raise CheckpointError(f"{ckpt}: {name}, which it builds on, is missing or was rewritten; resume again: "
                                  "it falls back to an earlier intact checkpoint")
        folders.append(base)
    return [*folders, ckpt]


def next_bases(previous: list[list[str]], full_every: int) -> list[list[str]]:
    """``bases`` of the next checkpoint, given the chain (bases and itself) of the previous one: none (a full
    snapshot) when there is no previous one or its chain already holds ``full_every`` checkpoints."""
    return [] if not previous or len(previous) >= full_every else previous


def new_links(bases: list[list[str]]) -> dict[str, Any]:
    """What a checkpoint's state.json records of its chain."""
    return {"id": uuid.uuid4().hex, "bases": bases}


def links_of(state: dict[str, Any], name: str) -> list[list[str]]:
    """A published checkpoint's chain: its bases, then itself (checkpoints from before deltas are all full)."""
    return [*state.get("bases", []), [name, state.get("id")]]


@contextmanager
def local_checkpoint(location: str | None) -> Iterator[Path | None]:
    """``location`` as a local folder with the checkpoints it builds on beside it (downloaded for a URI)."""
    if location is None or not storage.is_uri(location):
        yield None if location is None else Path(location)
        return
    parent, name = storage.parent_and_name(location)
    store = storage.Store(parent)
    with tempfile.TemporaryDirectory(prefix="fedsim-in-") as tmp:
        store.download_tree(Path(tmp, name), name)
        for base, _ in _state_json(Path(tmp, name)).get("bases", []):
            store.download_tree(Path(tmp, base), base)
        yield Path(tmp, name)


def commit(staging: Path, round_idx: int, global_vector: np.ndarray, meta: dict[str, Any],
           server_state: dict[str, np.ndarray] | None = None) -> Path:
    """Write the server's part, fsync everything, and atomically publish the checkpoint."""
    with space_named(staging / "global.npy", global_vector.nbytes), open(staging / "global.npy", "wb") as f:
        np.save(f, global_vector)
        f.flush()
        os.fsync(f.fileno())
    if server_state:
        needed = sum(array.nbytes for array in server_state.values())
        with space_named(staging / "server.npz", needed), open(staging / "server.npz", "wb") as f:
            # numpy >= 2.1's stub lets **server_state fill savez's allow_pickle: bool; its keys are state names, and
            # passing allow_pickle itself would store it as an array under numpy < 2.1 (pyproject allows 1.24).
            np.savez(f, **server_state)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
    own = {name: file_digest(staging / name) for name in ("global.npy", "server.npz") if (staging / name).exists()}
    state = {"round": round_idx, "global_size": int(global_vector.size),
             "workers": sorted(p.name for p in staging.glob("worker-*.npz")), **meta,
             "digests": {**meta.get("digests", {}), **own}}
    (staging / "state.json").write_text(json.dumps(state))
    _fsync_file(staging / "state.json")
    _fsync_dir(staging)
    final = staging.parent / f"round-{round_idx:04d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    latest_tmp = staging.parent / ".latest.tmp"
    latest_tmp.write_text(final.name)
    _fsync_file(latest_tmp)
    os.replace(latest_tmp, staging.parent / "latest")
    _fsync_dir(staging.parent)
    prune(staging.parent, round_idx)
    return final


def round_of(folder: Path) -> int | None:
    """The round a ``round-NNNN`` folder holds (any number of digits), else None."""
    prefix, _, digits = folder.name.partition("-")
    return int(digits) if prefix == "round" and digits.isdigit() else None


def _by_round(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """Checkpoint folders, newest round first (by number: 'round-10000' sorts before 'round-9999' by name)."""
    found = [(round_of(p), p) for p in ckpt_dir.glob("round-*") if p.is_dir()]
    return sorted(((r, p) for r, p in found if r is not None), key=lambda rp: rp[0], reverse=True)


def _kept(rounds: list[int], current: int, bases_of: Callable[[int], list[list[str]]]) -> set[int]:
    """The checkpoint just published, the KEEP-1 newest before it, and every checkpoint they build on. Later
    ones are left over from before a rollback or a resume that fell back past them: the run is redoing those rounds."""
    kept = sorted((r for r in rounds if r <= current), reverse=True)[:KEEP]
    bases = {round_of(Path(name)) for r in kept for name, _ in bases_of(r)}
    return set(kept) | {r for r in bases if r is not None}


def _bases_or_none(read_state_json: Callable[[], str | bytes]) -> list[list[str]]:
    try:
        bases: list[list[str]] = json.loads(read_state_json()).get("bases", [])
        return bases
    except (OSError, ValueError, AttributeError):
        return []  # a damaged checkpoint keeps nothing alive


def prune(ckpt_dir: Path, current: int) -> None:
    folders = {r: p for r, p in _by_round(ckpt_dir)}
    kept = _kept(list(folders), current, lambda r: _bases_or_none((folders[r] / "state.json").read_text))
    for r, folder in folders.items():
        if r not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def intact(ckpt: Path) -> bool:
    """Whether every file of a checkpoint and of those it builds on is present and readable (zip CRCs and all)."""
    try:
        return all(_files_intact(folder) for folder in chain(ckpt))
    except CheckpointError:
        return False


def _files_intact(ckpt: Path) -> bool:
    try:
        state = json.loads(safe_files.read_text(ckpt / "state.json"))
        if type(state["round"]) is not int or state["round"] != round_of(ckpt):  # a state.json moved or edited
            return False
        if any(file_digest(ckpt / name) != digest for name, digest in state.get("digests", {}).items()):
            return False  # a file changed after it was written (a flipped byte, an edited shard)
        weights = _load_array(ckpt / "global.npy")
        if weights.dtype != np.float32 or weights.ndim != 1 or weights.size != state["global_size"]:
            return False
        archives = state["workers"] + (["server.npz"] if (ckpt / "server.npz").exists() else [])
        for name in archives:
            with safe_files.open_regular(ckpt / name) as f, zipfile.ZipFile(f) as z:
                if z.testzip() is not None:
                    return False
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError):
        return False
    return True


def latest(run_dir: Path) -> Path | None:
    """The newest intact checkpoint of a run, or None when it has none. ``latest`` names the newest;
    when it is missing, dangling or names a damaged checkpoint, the newest intact older one is used, so a
    crash or a broken disk block costs the rounds since that checkpoint instead of the whole run."""
    ckpt_dir = run_dir / CHECKPOINTS
    pointer = ckpt_dir / "latest"
    try:
        named = ckpt_dir / safe_files.read_text(pointer).strip()
    except (OSError, ValueError):
        named = None
    if named is not None and named.parent == ckpt_dir and round_of(named) is not None and intact(named):
        return named
    chosen = next((p for _, p in _by_round(ckpt_dir) if intact(p)), None)
    if named is not None:
        logging.getLogger(__name__).warning(
            "fedsim: warning: %s names %s, which is missing or damaged; resuming from %s", pointer, named.name,
            chosen.name if chosen else "round 0 (no intact checkpoint left)")
    return chosen


def read_state(ckpt: Path, expected_fingerprint: str,
               global_size: int) -> tuple[dict[str, Any], np.ndarray, dict[str, np.ndarray]]:
    """Validate a checkpoint against this run and return (state, global vector, other server state)."""
    try:
        state = json.loads(safe_files.read_text(ckpt / "state.json"))
        global_vector = _load_array(ckpt / "global.npy")
        server_state = _read_server_state(ckpt / "server.npz")
        missing = [w for w in state["workers"] if not (ckpt / w).is_file()]
        int(state["round"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{ckpt}: truncated or unreadable checkpoint ({err}); delete it to resume from an earlier one")
    if missing:
        raise CheckpointError(f"{ckpt}: missing {missing[0]}; delete the folder to resume from an earlier checkpoint")
    if state.get("fingerprint") != expected_fingerprint or global_vector.shape != (global_size,):
        raise CheckpointError(f"{ckpt}: checkpoint of a different configuration (model, data, algorithm or seed differ); "
                              "resume with the run's own config.yaml or start a new run")
    return state, global_vector.astype(np.float32), server_state


def _read_server_state(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        return {}
    try:
        with safe_files.open_regular(path) as f, np.load(f, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except zipfile.BadZipFile as err:
        raise ValueError(f"{path.name}: {err}") from None


def begin(run_location: str, round_idx: int) -> str:
    """Where this round's checkpoint files go: a local temporary folder (renamed into place by ``finish``),
    or the round's own folder in an object store."""
    if not storage.is_uri(run_location):
        return str(staging_dir(Path(run_location), round_idx))
    folder = storage.join(run_location, CHECKPOINTS, f"round-{round_idx:04d}")
    storage.Store(folder).delete("")  # left from before a rollback; ``latest`` names an older round meanwhile
    return folder


def _npy_bytes(write: Callable[..., None], *args: np.ndarray, **arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    write(buffer, *args, **arrays)
    return buffer.getvalue()


def finish(staging: str, round_idx: int, global_vector: np.ndarray, meta: dict[str, Any], workers: list[str],
           server_state: dict[str, np.ndarray] | None = None) -> str:
    """Publish the checkpoint whose worker files (``workers``) are already in ``staging``; returns its location."""
    if not storage.is_uri(staging):
        return str(commit(Path(staging), round_idx, global_vector, meta, server_state))
    ckpt_dir, name = storage.parent_and_name(staging)
    store = storage.Store(ckpt_dir)
    files = {"global.npy": _npy_bytes(np.save, global_vector)}
    if server_state:
        files["server.npz"] = _npy_bytes(np.savez, **server_state)
    for file, data in files.items():
        store.write_bytes(f"{name}/{file}", data)
    own = {file: hashlib.sha256(data).hexdigest() for file, data in files.items()}
    state = {"round": round_idx, "global_size": int(global_vector.size), "workers": sorted(workers), **meta,
             "digests": {**meta.get("digests", {}), **own}}
    store.write_bytes(f"{name}/state.json", json.dumps(state).encode())
    store.write_bytes("latest", name.encode())  # last: the checkpoint is complete once this names it
    _prune_store(store, round_idx)
    return staging


def _prune_store(store: storage.Store, current: int) -> None:
    """As on a local disk (``_kept``)."""
    tops = {name.split("/")[0] for name in store.files()}
    rounds = {top: round_of(Path(top)) for top in tops}
    folders = {r: top for top, r in rounds.items() if r is not None}
    kept = _kept(list(folders), current, lambda r: _bases_or_none(lambda: store.read_bytes(f"{folders[r]}/state.json")))
    for r, folder in folders.items():
        if r not in kept:
            store.delete(folder)
