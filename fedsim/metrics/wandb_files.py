"""An offline W&B run read back from its folder (``RUN/wandb/offline-run-*``), without W&B's server: the history
rows it logged and the tables it saved. What the dashboard page's charts are drawn from (``docs/dashboard.py``)
and what the tests check W&B received."""
from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

BLOCK = 32768  # W&B's log is LevelDB-style: 32 KiB blocks of fragments, each a protobuf Record when joined
FULL, LAST = 1, 4


def records(log: Path) -> Iterator:
    """Every Record of a ``run-*.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = log.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{log}: not a W&B run log")
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            # wandb's generated module makes its message classes at import (protobuf's builder fills its globals()),
            # so no checker can see Record.
            rec = pb.Record()  # type: ignore[attr-defined]
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def log_of(offline: Path) -> Path:
    [log] = list(Path(offline).glob("run-*.wandb"))
    return log


def wait_until_written(offline: Path, timeout: float = 30.0) -> bool:
    """Wait for the run's exit record in its log: ``run.finish()`` returns before W&B's service process has
    written the file (measured: 2 of 8 offline runs' logs held only their 7-byte header just after ``finish``,
    and were complete 2 s later). Returns whether it was written within ``timeout`` seconds."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in records(log_of(offline))):
                return True
        except (ValueError, DecodeError):  # not there yet, or a record still being written
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def history(offline: Path) -> list[dict]:
    """Each ``wandb.log`` call's values by key (nested keys joined with '/'), once the run's log is written."""
    wait_until_written(offline)
    return [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            for r in records(log_of(offline)) if r.WhichOneof("record_type") == "history"]


def record(offline: Path, kind: str):
    """The first record of ``kind`` (run, exit, ...)."""
    return next(getattr(r, kind) for r in records(log_of(offline)) if r.WhichOneof("record_type") == kind)


def table(offline: Path, row: dict, key: str) -> list[dict]:
    """The rows of the table a history ``row`` logged under ``key`` (the row holds its file's path)."""
    if row.get(f"{key}/_type") != "table-file":
        raise KeyError(f"{key}: the history row logged no table there")
    data = json.loads((Path(offline) / "files" / row[f"{key}/path"]).read_text())
    return [dict(zip(data["columns"], row)) for row in data["data"]]
