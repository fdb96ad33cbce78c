"""Writes a run's metrics into its folder (and, when configured, to Weights & Biases).

Files are append-only during a run and truncated back to a checkpoint's round on resume or
rollback, so a resumed run's files equal those of an uninterrupted one.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from fedsim import atomic
from fedsim.engine.protocol import RoundResult
from fedsim.metrics.summary import summarize

JSONL_FILES = ("metrics.jsonl", "rounds.jsonl", "comm.jsonl")
ACC_KEYS = ("acc", "acc_personalized")


def read_jsonl(path: Path) -> list[dict]:
    """A JSONL file's rows, up to a last line cut short by a crash; no rows when the file is missing."""
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash
                break
    return rows


class RunLogger:
    def __init__(self, run_dir: Path, sink=None):
        self.run_dir = run_dir
        self.sink = sink  # e.g. a WandbSink; anything with log_round(row, records) and finish(summary, run_dir)
        self.files = {name: open(run_dir / name, "a") for name in JSONL_FILES}

    def truncate(self, last_round: int) -> None:
        """Keep only rows of rounds <= last_round (after a rollback or on resume)."""
        for name, handle in self.files.items():
            handle.close()
            kept = [r for r in read_jsonl(self.run_dir / name) if r["round"] <= last_round]
            atomic.write_text(self.run_dir / name, "".join(json.dumps(r) + "\n" for r in kept))
            self.files[name] = open(self.run_dir / name, "a")
        self._write_csv()

    def log_round(self, result: RoundResult) -> dict:
        """Append one round; returns its summary row."""
        records = result.records
        row = {"round": result.round, "seconds": result.seconds, "sampled": len(result.sampled),
               "evaluated": len(records),  # the eval.clients cohort, or everyone
               "dropped": result.dropped,
               "bytes_down": sum(c["bytes_down"] for c in result.comm),
               "bytes_up": sum(c["bytes_up"] for c in result.comm)}
        for key in ACC_KEYS:
            if records and key in records[0]:
                row[key] = summarize([r[key] for r in records])
        for name, rows in (("metrics.jsonl", records), ("comm.jsonl", result.comm), ("rounds.jsonl", [row])):
            self.files[name].writelines(json.dumps(r) + "\n" for r in rows)
            self.files[name].flush()
        if records:
            self._write_csv()
        if self.sink:
            self.sink.log_round(row, records)
        return row

    def sync(self) -> None:
        """Make everything logged so far durable (called before a checkpoint is published)."""
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())

    def _write_csv(self) -> None:
        """rounds.csv: one row per evaluation round, every across-client statistic as a column. Replaced
        whole (a kill mid-write leaves the previous version, which `fedsim report` can still read)."""
        rows = [r for r in read_jsonl(self.run_dir / "rounds.jsonl") if "acc" in r]
        columns = [(key, stat) for key in ACC_KEYS if rows and key in rows[0] for stat in rows[0][key]]
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(["round"] + [f"{key}_{stat}" for key, stat in columns])
        writer.writerows([r["round"]] + [r[key][stat] for key, stat in columns] for r in rows)
        atomic.write_text(self.run_dir / "rounds.csv", text.getvalue())

    def records_of_round(self, round_idx: int) -> list[dict]:
        return [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if r["round"] == round_idx]

    def comm_totals(self) -> dict:
        comm = read_jsonl(self.run_dir / "comm.jsonl")
        return {"bytes_down": sum(c["bytes_down"] for c in comm), "bytes_up": sum(c["bytes_up"] for c in comm)}

    def close(self, summary: dict | None = None) -> None:
        for handle in self.files.values():
            handle.close()
        if self.sink:
            self.sink.finish(summary, self.run_dir)

