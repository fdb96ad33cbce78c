"""Speaker attribution on Shakespeare, offline: which of a play's main speakers says this speech.

One client per play. A sample is one whole speech, tokenized with all-MiniLM-L6-v2's WordPiece tokenizer and
labelled with its speaker, for the play's ``speakers`` most frequent speakers by speech count (ties: the earlier
first speech) who have at least ``min_speeches`` speeches; everyone else's speeches are dropped, and a play left with
fewer than two such speakers (nothing to tell apart) too. Labels are global by default, each (play, speaker) its
own class, so clients hold disjoint label sets (FedPer's setting, where a personal head is needed); ``labels:
per_play`` numbers each play's speakers 0..k-1 by rank instead, so label 0 means a different person at each client
(the conflicting-label variant).

Whole speeches, not fixed-size chunks: a speech is the unit a speaker is attributed by, and chunks of one long speech
would be near-duplicate samples that could sit on both sides of the split; a speech longer than ``max_tokens`` is
truncated (``about["truncated_share"]`` says how many are). Each speaker's speeches are split in play order, its
first ``1 - test_share`` train, the rest test: a cut of the whole play instead would leave a speaker who leaves early
(Polonius) with no test speech and one who enters late with no training speech.

The speeches come from ``fedsim.data.shakespeare``'s parse of the sha256-checked tarball. Token ids are stored as
float32 (N, 1, max_tokens, 1) with mean 0 and std 1, so ``to_float`` hands a model the ids themselves (exact up to
2^24; the vocabulary has 30,522), padded with id 0 ([PAD]) after [SEP]. They are built once into fedsim's data
cache, keyed by the tarball's and the tokenizer's sha256 and the options, and memory-mapped afterwards.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.atomic import space_named
from fedsim.core.pretrained import INSTALL_FIX, SHA256, checked_file
from fedsim.data import shakespeare as shakespeare_parse
from fedsim.data.array_dataset import ARRAYS, GROUPS, ArrayDataset, content_digest
from fedsim.data.cache import cache_dir, cached, publish
from fedsim.data.shakespeare import (TARBALL_SHA256, Speech, check_tarball, read_tarball, speeches_by_play,
                                     tarball_options, tarball_path, whole_number)
from fedsim.errors import ConfigError, DataError

NAME = "shakespeare_speakers"
DEFAULTS: dict[str, Any] = {"variant": "modern", "plays": None, "speakers": 8, "min_speeches": 20,
                            "labels": "global", "max_tokens": 64, "test_share": 0.2, "path": None}
LABELS = ("global", "per_play")
MAX_POSITIONS = 512  # BERT's position table: a longer sequence has no position embedding


def options_of(options: dict) -> dict[str, Any]:
    """``data.options`` for shakespeare_speakers with its defaults, each checked (one line naming the field)."""
    o = tarball_options(NAME, DEFAULTS, options)
    if o["labels"] not in LABELS:
        raise DataError(f"data.options.labels: {o['labels']!r}; choose global (each (play, speaker) its own class) "
                        "or per_play (each play's speakers 0..k-1)")
    whole_number(NAME, "speakers", o["speakers"], 2)
    whole_number(NAME, "min_speeches", o["min_speeches"], 2)
    whole_number(NAME, "max_tokens", o["max_tokens"], 3, MAX_POSITIONS)
    return o


@dataclass(frozen=True)
class Cast:
    """One client: a play's kept speakers (most speeches first) and their speeches in play order."""

    play: str
    speakers: tuple[str, ...]
    speeches: tuple[Speech, ...]

    def counts(self) -> dict[str, int]:
        counted = Counter(s.speaker for s in self.speeches)
        return {speaker: counted[speaker] for speaker in self.speakers}


def cast_of(play: str, speeches: list[Speech], top: int, min_speeches: int) -> Cast:
    """The play's ``top`` most frequent speakers with at least ``min_speeches`` speeches, and their speeches."""
    counted = Counter(s.speaker for s in speeches)  # in order of first speech: the stable sort breaks ties by it
    ranked = sorted(counted, key=lambda speaker: -counted[speaker])
    kept = tuple(speaker for speaker in ranked[:top] if counted[speaker] >= min_speeches)
    return Cast(play, kept, tuple(s for s in speeches if s.speaker in kept))


def casts_of(path: Path, o: dict[str, Any]) -> tuple[list[Cast], list[str]]:
    """(the clients, the plays dropped for holding fewer than two speakers with min_speeches speeches)."""
    casts = [cast_of(play, speeches, o["speakers"], o["min_speeches"])
             for play, speeches in speeches_by_play(read_tarball(path), o["variant"], o["plays"]).items()]
    kept = [c for c in casts if len(c.speakers) >= 2]
    if not kept:
        raise DataError(f"data.options.min_speeches: no {o['variant']} play of {o['plays'] or 'all plays'} has two "
                        f"speakers with {o['min_speeches']} speeches; lower min_speeches or add plays")
    return kept, [c.play for c in casts if len(c.speakers) < 2]


def test_mask(ranks: np.ndarray, share: float) -> np.ndarray:
    """Which of one play's speeches (their speakers' ``ranks``, in play order) test: each speaker's last
    round(share x n), at least one and never all (min_speeches >= 2 leaves at least one to train)."""
    mask = np.zeros(len(ranks), bool)
    for rank in np.unique(ranks):
        mine = np.flatnonzero(ranks == rank)
        held = min(len(mine) - 1, max(1, int(np.floor(share * len(mine) + 0.5))))
        mask[mine[len(mine) - held:]] = True
    return mask


def tokenizer_file() -> Path:
    """MiniLM's tokenizer.json, its sha256 checked; refused naming this data set where the text extra is missing."""
    try:
        return checked_file("tokenizer.json")
    except (ConfigError, DataError) as err:
        raise DataError(f"data.dataset: {NAME} tokenizes with MiniLM's tokenizer: {err}") from None


def tokenizer(max_tokens: int) -> Any:
    """MiniLM's tokenizer from its checked tokenizer.json, truncating and padding (id 0) to ``max_tokens``."""
    path = tokenizer_file()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError(f"data.dataset: {NAME} tokenizes with MiniLM's tokenizer, whose library is not installed "
                        f"here; {INSTALL_FIX}") from None
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=max_tokens)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=max_tokens)
    return tok


def tokenized(texts: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(token ids (N, 1, max_tokens, 1) float32, whether each text was truncated (N,))."""
    encodings = tokenizer(max_tokens).encode_batch(texts)
    ids = np.array([e.ids for e in encodings], np.float32).reshape(len(texts), 1, max_tokens, 1)
    return ids, np.array([len(e.overflowing) > 0 for e in encodings], bool)


@dataclass(frozen=True)
class Built:
    arrays: dict[str, np.ndarray]  # ARRAYS + GROUPS by name
    classes: tuple[str, ...]
    about: dict[str, Any]


def build(path: Path, o: dict[str, Any]) -> Built:
    """Parse, label, split and tokenize every kept play (what the cache stores)."""
    casts, dropped = casts_of(path, o)
    texts, labels, groups, is_test, offset = [], [], [], [], 0
    for group, cast in enumerate(casts):
        ranks = np.array([cast.speakers.index(s.speaker) for s in cast.speeches], np.int64)
        texts += [s.text for s in cast.speeches]
        labels.append(ranks + (offset if o["labels"] == "global" else 0))
        groups.append(np.full(len(ranks), group, np.int64))
        is_test.append(test_mask(ranks, o["test_share"]))
        offset += len(cast.speakers)
    ids, truncated = tokenized(texts, o["max_tokens"])
    y, g, test = np.concatenate(labels), np.concatenate(groups), np.concatenate(is_test)
    arrays = {"train_x": ids[~test], "train_y": y[~test], "test_x": ids[test], "test_y": y[test],
              "train_groups": g[~test], "test_groups": g[test]}
    classes = (tuple(f"{c.play}/{s}" for c in casts for s in c.speakers) if o["labels"] == "global"
               else tuple(f"speaker {rank + 1}" for rank in range(max(len(c.speakers) for c in casts))))
    return Built(arrays, classes, summary(o, casts, dropped, test, g, truncated))


def summary(o: dict[str, Any], casts: list[Cast], dropped: list[str], test: np.ndarray, groups: np.ndarray,
            truncated: np.ndarray) -> dict[str, Any]:
    """What --dry-run prints (the single values) and the run folder's dataset.json keeps (all of it)."""
    labels = [len(c.speakers) for c in casts]
    samples = [len(c.speeches) for c in casts]
    return {"variant": o["variant"], "labels": o["labels"], "num_clients": len(casts), "num_classes": sum(labels)
            if o["labels"] == "global" else max(labels), "labels_per_client_min": min(labels),
            "labels_per_client_max": max(labels), "speeches_train": int((~test).sum()),
            "speeches_test": int(test.sum()), "speeches_per_client_min": min(samples),
            "speeches_per_client_max": max(samples), "max_tokens": o["max_tokens"],
            "truncated_share": round(float(truncated.mean()), 4), "plays_dropped": len(dropped),
            "dropped": dropped,
            "clients": {c.play: {"speakers": c.counts(), "train": int(np.sum((groups == i) & ~test)),
                                 "test": int(np.sum((groups == i) & test)),
                                 "truncated": int(np.sum((groups == i) & truncated))}
                        for i, c in enumerate(casts)}}


def cache_key(path: Path, o: dict[str, Any]) -> str:
    """What the arrays are a function of: the pinned tarball (checked) and tokenizer, the options that shape them (not
    where the file lies) and the code that builds them (this module's and the parse's), so a changed build never
    reads arrays an older one cached."""
    check_tarball(path)
    tokenizer_file()  # its sha256 checked against the pinned one, which therefore stands for it
    shaping = {key: value for key, value in o.items() if key != "path"}
    h = hashlib.sha256(f"{TARBALL_SHA256}\0{SHA256['tokenizer.json']}\0{json.dumps(shaping, sort_keys=True)}\0"
                       .encode())
    for code in (Path(__file__), Path(shakespeare_parse.__file__)):
        h.update(code.read_bytes())
    return h.hexdigest()[:16]


def save(folder: Path, built: Built, o: dict[str, Any]) -> None:
    """Write ``built`` beside ``folder`` under a name of our own, then publish it (``fedsim.data.cache.publish``): no
    reader ever sees a half-written cache, and a copy another process published first is kept (and may be in use)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared
        for name, array in built.arrays.items():
            with space_named(folder / f"{name}.npy", array.nbytes):
                np.save(tmp / f"{name}.npy", array)
        digest = content_digest(*(built.arrays[a] for a in ARRAYS + GROUPS))
        meta = {"classes": list(built.classes), "about": built.about, "digest": digest}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish(tmp, folder, lambda: load(folder, o["max_tokens"], o["variant"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(folder: Path, max_tokens: int, variant: str) -> ArrayDataset | None:
    """The cached data set, memory-mapped, or None when it is missing or damaged (then it is rebuilt)."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        arrays = {a: np.load(folder / f"{a}.npy", mmap_mode="r", allow_pickle=False) for a in ARRAYS + GROUPS}
        dataset = ArrayDataset(f"{NAME}-{variant}", arrays["train_x"], arrays["train_y"], arrays["test_x"],
                               arrays["test_y"], tuple(meta["classes"]), (0.0,), (1.0,), arrays["train_groups"],
                               arrays["test_groups"], augmentable=False, digest=str(meta["digest"]),
                               about=dict(meta["about"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # AttributeError: meta not a dict
        return None
    return dataset if intact(dataset, max_tokens) else None


def intact(data: ArrayDataset, max_tokens: int) -> bool:
    """Whether the arrays have the shapes, types and label range ``build`` gives them."""
    pairs = ((data.train_x, data.train_y, data.train_groups), (data.test_x, data.test_y, data.test_groups))
    return all(x.dtype == np.float32 and x.shape[1:] == (1, max_tokens, 1) and g is not None
               and y.dtype == g.dtype == np.int64 and len(x) == len(y) == len(g)
               and (len(y) == 0 or 0 <= int(y.min()) <= int(y.max()) < data.num_classes) for x, y, g in pairs)


def shakespeare_speakers(root: Path | None, options: dict) -> ArrayDataset:
    """``data.dataset: shakespeare_speakers``: read from the cache, built into it on first use."""
    o = options_of(options)
    path = tarball_path(root, o)
    folder = cache_dir() / f"{NAME}-{cache_key(path, o)}"
    return cached(folder, lambda: load(folder, o["max_tokens"], o["variant"]), lambda: save(folder, build(path, o), o))
