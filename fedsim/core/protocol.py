"""What the server and the workers send each other, and what a round returns to the entrypoint.
Free of torch: the server's process only routes and aggregates."""
from __future__ import annotations

import functools
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, cast

import numpy as np

from fedsim.core.aggregate import FixedPoint

WEIGHTS = "weights"  # the upload / server-state entry holding the shared model weights

# What an evaluation record scores, by key: the model a client holds (initial) and, after eval.finetune_epochs of
# fine-tuning, its personalized model. Logs, summaries, reports and W&B name the two kinds from here.
ACCURACIES = {"acc": "initial", "acc_personalized": "personalized"}
# data.validation: each record's scores on the client's validation split, under this prefix (``validation_acc``
# beside test's ``acc``); whatever selects a round reads them where they exist. A module's validation_step values on
# that split carry the prefix too (``validation_val_loss``); without data.validation its validation_step scores test
# data, under the module's own names, and selection must never read those.
VALIDATION = "validation_"


def on_validation(key: str) -> str:
    """The name of a record's score ``key`` (``acc``, ``loss_personalized``) on the validation split."""
    return VALIDATION + key


# Every accuracy a record may hold and its name: test's, then validation's.
SCORED = ACCURACIES | {on_validation(key): f"{name}, validation" for key, name in ACCURACIES.items()}
# The columns of a per-client record (metrics.jsonl) fedsim itself writes; any other is a user module's self.log.
_SCORES = ("loss", "acc", "loss_personalized", "acc_personalized")
RECORD_KEYS = frozenset({"client", "round", "n_train", "n_test", "n_validation", *_SCORES, *map(on_validation, _SCORES),
                         "train_loss", "times_sampled", "unseen"})


class ClientRecord(TypedDict, total=False):
    """One client's evaluation record on an evaluation round, from its worker (scored) through the server (who it
    is this round) to metrics.jsonl, W&B and ``fedsim report``. Beside these columns it carries numbers under names
    fedsim does not fix: the scores on the validation split (``validation_acc``, :func:`on_validation`), a user
    module's ``self.log`` values and a method's ``ctx.record`` values. A TypedDict cannot declare such columns (PEP
    728's ``extra_items`` is not in mypy yet): :func:`add_columns` adds them, the one place that does; readers of
    any column by a computed name read the record as a ``Mapping[str, Any]``."""
    client: Required[int]
    n_train: int
    n_test: int
    n_validation: int  # data.validation: the client's held-out part of its training data
    loss: float
    acc: float
    loss_personalized: float  # eval.personalizes: after fine-tuning (or the method's own update)
    acc_personalized: float
    round: int
    train_loss: float | None  # None: the client did not train this round
    times_sampled: int  # rounds it has trained in so far (0: scored with its round-0 personal part)
    unseen: bool  # held out of training by eval.unseen


def add_columns(record: ClientRecord, columns: Mapping[str, float]) -> None:
    """Add ``columns`` (scores, ``self.log`` or ``ctx.record`` values) to ``record``, in place and in order, as
    ``dict.update`` does."""
    cast(dict[str, Any], record).update(columns)


class CommRecord(TypedDict):
    """One kept client's traffic in one round (comm.jsonl)."""
    round: int
    client: int
    bytes_down: int
    bytes_up: int


def selecting(key: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """The key a selection of ``key`` reads in these rows: its validation score where they have one, else ``key``
    itself (test: a best-on-test number, not a selection)."""
    return on_validation(key) if any(on_validation(key) in r for r in rows) else key
# Words that make a metric lower-is-better (a loss, an error): fedsim's own losses and a user module's self.log names
# alike, e.g. loss, train_loss, val_loss, val/error, test_mse, nll; every other metric (an accuracy, an F1) is higher-is-better.
LOWER_IS_BETTER = frozenset({"loss", "error", "err", "mse", "mae", "rmse", "nll", "perplexity", "ppl"})


def lower_is_better(name: str) -> bool:
    """Whether a smaller value of the metric ``name`` is better: one of its words (split at anything that is not a
    letter or a digit) is in LOWER_IS_BETTER. Every statistic over clients (p10, worst10) and ASHA's default mode
    follow it."""
    return any(word in LOWER_IS_BETTER for word in re.split(r"[^a-z0-9]+", name.lower()))


def logged_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names a user module logged in these records (every numeric column fedsim does not write itself)."""
    return sorted({k for r in records for k, v in r.items()
                   if k not in RECORD_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)})


@dataclass(frozen=True)
class ClientData:
    train: np.ndarray  # indices into the dataset's train arrays
    test: np.ndarray
    label_map: np.ndarray | None = None  # client label = label_map[true label] (conflicting-label partitions)
    # data.validation: indices into the train arrays held out of ``train`` (empty: no validation split)
    val: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


def serialized_size(array: np.ndarray) -> int:
    return len(pickle.dumps(array, protocol=5))


@functools.lru_cache(maxsize=64)
def payload_bytes(values: int) -> int:
    """The serialised size of a float32 vector of ``values`` values: it depends only on the length, so it
    is computed once, not by pickling every client's upload."""
    return serialized_size(np.zeros(values, np.float32))


@dataclass(frozen=True)
class FixedPointScales:
    """What the server fixes before a round so that workers can sum their clients' uploads exactly:
    per upload, its fixed-point scale and whether clients weigh by sample count or equally."""
    scales: dict[str, FixedPoint]
    uniform: dict[str, bool]
    # Asynchronous rounds: per client, the staleness factor its upload is scaled by (its weight in the mean's
    # denominator stays n_j or 1). Absent: 1, and the sums are those of a synchronous round bit for bit.
    factors: dict[int, float] = field(default_factory=dict)
    # User-level DP (fedsim.privacy): the L2 bound each client's update of the shared part is clipped to before it is
    # summed (the server's adaptive clip norm, or privacy.clip_norm). None: no DP, uploads are summed as they are.
    clip_norm: float | None = None


@dataclass(frozen=True)
class ClientReport:
    """A trained client, as the server sees it: no weights, only what it logs and decides on."""
    client: int
    n_train: int
    train_loss: float
    bytes_up: int  # what this client would send on its own: the serialised size of its uploads
    diverged: bool = False  # non-finite loss, or an upload outside the fixed-point range: nothing was kept
    out_of_range: bool = False  # diverged because an upload left the fixed-point range (the loss was finite)
    logged: dict[str, float] = field(default_factory=dict)  # the module's self.log values of this round's training
    # Under DP: the L2 norm of its update of the shared part before clipping, a simulator diagnostic the server only
    # counts (fedsim.privacy.mechanism.ServerPrivacy.after_round)
    update_norm: float | None = None


@dataclass(frozen=True)
class WorkerPartial:
    """One worker's share of a round: its clients' reports and the exact sums of their weighted uploads."""
    reports: list[ClientReport]
    sums: dict[str, np.ndarray]  # upload -> int64 quanta
    weights: dict[str, int]  # upload -> total weight of the clients summed


@dataclass(frozen=True)
class Reply:
    """One kept client's round as a server that sees replies gets it: its uploads as float32 host arrays."""
    client: int
    n_train: int
    uploads: dict[str, np.ndarray]


@dataclass(frozen=True)
class WorkerReplies:
    """One worker's share of a round whose server sees replies: its clients' reports and each kept client's
    uploads, in the order it trained them."""
    reports: list[ClientReport]
    replies: list[Reply]


def arrays_bytes(vectors: dict[str, np.ndarray]) -> int:
    """The serialised size of a message of arrays (a broadcast), from their shapes and types alone."""
    return sum(_array_bytes(v.shape, v.dtype.str) for v in vectors.values())


@functools.lru_cache(maxsize=256)
def _array_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return serialized_size(np.zeros(shape, dtype))


@dataclass(frozen=True)
class RoundResult:
    """A completed round: who trained, per-client evaluation records (on evaluation rounds) and traffic."""
    round: int
    sampled: list[int]
    dropped: list[int]  # diverged clients whose updates were left out (train.on_nonfinite=drop)
    records: list[ClientRecord] = field(default_factory=list)
    comm: list[CommRecord] = field(default_factory=list)
    seconds: float = 0.0
    # The CPU time the round took in the workers' calls and on the server: unlike ``seconds`` (wall), not raised by
    # other processes' load on the machine (on a GPU, the host's share only).
    cpu_seconds: float = 0.0
    timing: dict[str, Any] = field(default_factory=dict)  # on the virtual clock: the round's simulated time and who took part
    # The method's server-side mechanism after this round's server step (Algorithm.mechanism: FedAMP's self-weights,
    # IFCA's cluster sizes), by name; rounds.jsonl keeps it under "mechanism".
    mechanism: dict[str, float] = field(default_factory=dict)
    # User-level DP's mechanism in this round (fedsim.privacy.mechanism.ServerPrivacy.after_round: the clip norm, the
    # clipped fraction, the mean update norm, the noise std), by name; rounds.jsonl keeps it under "privacy".
    privacy: dict[str, float] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)  # DP's epsilon spent by the round's end (RunPlan.privacy_at)


@dataclass(frozen=True)
class RoundFailed:
    """The run cannot continue (a client's loss became non-finite under train.on_nonfinite=stop)."""
    round: int
    error: str


@dataclass(frozen=True)
class RolledBack:
    """A worker was lost: everything after ``to_round`` (the last checkpoint) is redone."""
    round: int
    to_round: int


RoundOutcome = RoundResult | RoundFailed | RolledBack
