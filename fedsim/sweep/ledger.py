"""``sweep.json``, a sweep's ledger: the runs its scheduler stopped, so that running the sweep again keeps them
stopped. The ledger is input (anyone may have edited it, or left it from another sweep of the same name): it is
read strictly before Ray starts, a malformed one is one line naming the file and the field, and an entry counts
only for the sweep that wrote it and for the very settings its run had then (``results_fingerprint``); any other
entry is dropped with one line, and its run is brought to completion again."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from fedsim import storage
from fedsim.errors import ConfigError

LEDGER = "sweep.json"


class StoppedRun(BaseModel):
    """One run the scheduler stopped: at which round, the settings it ran with (``config``: None in a ledger from
    before fingerprints, which therefore never counts) and the scheduler's metric there (an extra key named for it)."""
    model_config = ConfigDict(extra="allow", strict=True)
    round: int | None
    config: str | None = None


class LedgerFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    sweep: str
    stopped: dict[str, StoppedRun]


def read_stopped(folder: str, sweep_id: str, fingerprints: Mapping[str, str],
                 say: Callable[[str], None]) -> dict[str, dict]:
    """The runs of this sweep (``fingerprints``: each run's name and results fingerprint) that the ledger in
    ``folder`` says the scheduler stopped, each entry as stored."""
    store, where = storage.Store(folder), storage.join(folder, LEDGER)
    if not store.exists(LEDGER):
        return {}
    try:
        ledger = LedgerFile.model_validate_json(store.read_bytes(LEDGER))
    except ValidationError as err:
        raise ConfigError(f"{where}: {_first_problem(err)}; remove it to run the stopped trials again") from None
    if ledger.sweep != sweep_id:
        say(f"{where}: written by sweep {ledger.sweep}, not by this one ({sweep_id}); the runs it lists as stopped "
            "are brought to completion")
        return {}
    kept = {}
    for name, entry in ledger.stopped.items():
        if name not in fingerprints:
            continue  # a run this sweep no longer has: nothing of it is listed
        if entry.config != fingerprints[name]:
            say(f"{name}: {where} lists it as stopped with other settings than it has now; bringing it to completion")
            continue
        kept[name] = entry.model_dump()
    return kept


def write_stopped(folder: str, sweep_id: str, stopped: Mapping[str, dict]) -> None:
    storage.Store(folder).write_bytes(LEDGER, json.dumps({"sweep": sweep_id, "stopped": stopped}, indent=1).encode())


def _first_problem(err: ValidationError) -> str:
    """Pydantic's first error as the field it is about (dotted, as in the file) and what is wrong there."""
    first = err.errors()[0]
    if first["type"] == "json_invalid":
        return f"not JSON ({first['msg']})"
    field = ".".join(str(part) for part in first["loc"])
    return f"field {field or '(the top level)'}: {first['msg']} (got {json.dumps(first.get('input'), default=str)[:60]})"
