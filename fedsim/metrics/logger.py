"""Writes a run's metrics into its folder: ``metrics.jsonl`` (a record per client and evaluation round),
``rounds.jsonl`` and ``rounds.csv`` (a row per round), ``comm.jsonl`` (traffic) and, at the end,
``summary.json``. A callback of the driver loop.

Files are append-only during a run and truncated back to a checkpoint's round on resume or
rollback, so a resumed run's files equal those of an uninterrupted one.
"""
from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedsim import atomic, safe_files
from fedsim.config import RunConfig
from fedsim.core.protocol import ACCURACIES, SCORED, RoundResult, logged_keys, lower_is_better, selecting
from fedsim.core import runfiles
from fedsim.core.results import read_results
from fedsim.engine.driver import Callback, Run, utc_now
from fedsim.metrics.parts import Parts
from fedsim.metrics.summary import summarize


def read_jsonl(path: Path) -> list[dict]:
    """A JSONL file's rows, up to a last line cut short by a crash; no rows when the file is missing."""
    rows = []
    if path.exists():
        for line in safe_files.read_text(path).splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash
                break
    return rows


# Marks rows whose cpu_seconds count the local backend's one process once: rows written before it (up to e56b602)
# counted a local run's worker twice, its process time and again as a worker's, so those are no measure of it.
CPU_COUNTED_ONCE = "cpu_counted_once"


def round_row(result: RoundResult) -> dict:
    """A round's summary row: its time, who took part, its traffic and each accuracy's statistics across clients."""
    records: Sequence[Mapping[str, Any]] = result.records  # read by computed column names
    row = {"round": result.round, "seconds": result.seconds, "cpu_seconds": result.cpu_seconds,
           CPU_COUNTED_ONCE: True,
           "sampled": len(result.sampled),
           "evaluated": len(records),  # the eval.clients cohort, or everyone
           "dropped": result.dropped,
           "bytes_down": sum(c["bytes_down"] for c in result.comm),
           "bytes_up": sum(c["bytes_up"] for c in result.comm), **result.timing, **result.spent}
    for key in SCORED:
        if records and key in records[0]:
            row[key] = summarize([r[key] for r in records])
    for key in logged_keys(records):  # self.log and ctx.record values, across the clients that logged them
        row[key] = summarize([r[key] for r in records if r.get(key) is not None], lower_is_better(key))
    if result.mechanism:  # the method's server-side mechanism (Algorithm.mechanism)
        row["mechanism"] = dict(result.mechanism)
    if result.privacy:  # user-level DP's clip norm, clipped fraction, update norm and noise (fedsim.privacy)
        row["privacy"] = dict(result.privacy)
    return row


class JsonlLogger(Callback):
    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self.files: dict[str, io.TextIOWrapper] = {}
        self.run_parts: Parts | None = None  # the run's invocations and their wall time, from on_run_start

    @property
    def folder(self) -> Path:
        """The run's folder: on_run_start sets it before any other hook writes."""
        assert self.run_dir is not None, "JsonlLogger: a hook ran before on_run_start"
        return self.run_dir

    @property
    def parts(self) -> Parts:
        assert self.run_parts is not None, "JsonlLogger: a hook ran before on_run_start"
        return self.run_parts

    def on_run_start(self, run: Run, done: int) -> None:
        self.run_dir = run.run_dir
        self.files = {name: open(self.run_dir / name, "a") for name in runfiles.JSONL_RESULTS}
        self.truncate(done)
        self.run_parts = Parts(self.run_dir, run.started_at, done)

    def on_rollback(self, run: Run, to_round: int) -> None:
        self.truncate(to_round)
        self.parts.reached(to_round)

    def truncate(self, last_round: int) -> None:
        """Keep only rows of rounds <= last_round (after a rollback or on resume): the rounds after it are redone.
        Every file is read (and a damaged one refused) before any is rewritten."""
        kept = {name: [r for r in read_results(self.folder / name) if r["round"] <= last_round] for name in self.files}
        for name, handle in self.files.items():
            handle.close()
            atomic.write_text(self.folder / name, "".join(json.dumps(r) + "\n" for r in kept[name]))
            self.files[name] = open(self.folder / name, "a")
        self._write_csv()

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        """Append one round."""
        row = round_row(result)
        for name, rows in ((runfiles.METRICS, result.records), (runfiles.COMM, result.comm), (runfiles.ROUNDS, [row])):
            self.files[name].writelines(json.dumps(r) + "\n" for r in rows)
            self.files[name].flush()
        if result.records:
            self._write_csv()
        self.parts.reached(result.round)

    def on_save_checkpoint(self, run: Run, round_idx: int) -> None:
        """Make everything logged so far durable: a published checkpoint never points past what is on disk."""
        for handle in self.files.values():
            handle.flush()
            os.fsync(handle.fileno())
        self.parts.record(run)

    def _write_csv(self) -> None:
        """rounds.csv: one row per evaluation round, every across-client statistic as a column. Replaced
        whole (a kill mid-write leaves the previous version, which `fedsim report` can still read)."""
        rows = [r for r in read_jsonl(self.folder / runfiles.ROUNDS) if "acc" in r]
        columns = [(key, stat) for key in SCORED if rows and key in rows[0] for stat in rows[0][key]]
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(["round"] + [f"{key}_{stat}" for key, stat in columns])
        writer.writerows([r["round"]] + [r[key][stat] for key, stat in columns] for r in rows)
        atomic.write_text(self.folder / runfiles.ROUNDS_CSV, text.getvalue())

    def on_run_end(self, run: Run, error: BaseException | None) -> None:
        for handle in self.files.values():
            handle.close()
        if self.run_parts is not None:  # None: the run ended before it started (on_run_start never came)
            self.run_parts.record(run)
        if error is None and self.run_dir is not None:
            run.summary = self._summary(run)
            atomic.write_text(self.run_dir / runfiles.SUMMARY, json.dumps(run.summary, indent=1))

    def _summary(self, run: Run) -> dict:
        cfg = run.plan.cfg
        records = [r for r in read_jsonl(self.folder / runfiles.METRICS) if r["round"] == cfg.train.rounds]
        summary = {"name": cfg.name, "algorithm": cfg.algorithm.name, "rounds": cfg.train.rounds,
                   "never_sampled": sum(r.get("times_sampled") == 0 for r in records)}
        for key in SCORED:
            if records and key in records[0]:
                per_client = {r["client"]: r[key] for r in records}
                summary[key] = summarize(list(per_client.values()))
                summary[f"per_client_{key}"] = per_client
        for key in logged_keys(records):
            summary[key] = summarize([r[key] for r in records if r.get(key) is not None], lower_is_better(key))
        if cfg.eval.unseen is not None:  # the generalization protocol: held-out clients apart from the others
            for group, chosen in (("seen", [r for r in records if not r.get("unseen")]),
                                  ("unseen", [r for r in records if r.get("unseen")])):
                summary[group] = {key: summarize([r[key] for r in chosen]) for key in ACCURACIES
                                  if chosen and key in chosen[0]} | {"clients": len(chosen)}
        rounds = read_jsonl(self.folder / runfiles.ROUNDS)
        summary["best_round"] = best_rounds(rounds)
        summary["reported"] = run.plan.reported_accuracy  # the accuracy the one-line summary shows
        # What trained, read from the module's optimizers once set up (--dry-run's lines): a receipt reports these,
        # never train.body / train.head, which a module's own configure_optimizers does not take.
        summary["optimizers"] = list(run.plan.model.optimizers)
        if run.plan.privacy is not None:  # epsilon at the final round, delta, z, accountant, sampling
            summary["privacy"] = run.plan.privacy.summary
        if run.plan.system is not None:
            summary["system"] = system_summary(cfg, rounds, records, run.plan.system.devices.kind)
        comm = read_jsonl(self.folder / runfiles.COMM)
        summary.update(comm={"bytes_down": sum(c["bytes_down"] for c in comm), "bytes_up": sum(c["bytes_up"] for c in comm)},
                       **self.parts.summary(), workers=run.workers,
                       started_at=run.started_at, finished_at=utc_now(), **run.extras)  # of the invocation that finished it
        return summary


def best_rounds(rounds: list[dict]) -> dict[str, dict]:
    """Per accuracy, the evaluation round with the highest validation mean across clients (the first on a tie), with
    test's statistics there and validation's under ``validation``. A run without validation data (data.validation 0)
    has only test to go by: its best round is the best on test, as PFLlib and the FedBABU authors report it, and is
    labelled so (``picked_on: test``): a number to compare with theirs, not a selection."""
    best = {}
    for key in ACCURACIES:
        picker = selecting(key, rounds)
        scored = [r for r in rounds if key in r and picker in r]
        if scored:
            top = max(scored, key=lambda r: (r[picker]["mean"], -r["round"]))
            best[key] = {"round": top["round"], **top[key], "picked_on": "validation" if picker != key else "test"}
            if picker != key:
                best[key]["validation"] = top[picker]
    return best


def system_summary(cfg: RunConfig, rounds: list[dict], records: list[dict], kinds: tuple[str, ...]) -> dict:
    """The virtual clock's totals, time to each system.target_accuracy, and the final round's accuracies by
    device class and by how often a client took part."""
    out = {"sim_seconds": rounds[-1]["sim_time_s"] if rounds else 0.0,
           "dropouts": sum(len(r["dropouts"]) for r in rounds), "late": sum(len(r["late"]) for r in rounds),
           "empty_rounds": sum(r["sampled"] == 0 for r in rounds),
           "time_to_accuracy": {key: {str(t): next((r["sim_time_s"] for r in rounds
                                                    if key in r and r[selecting(key, rounds)]["mean"] >= t), None)
                                      for t in cfg.system.target_accuracy}
                                for key in ACCURACIES if rounds and any(key in r for r in rounds)},
           "time_to_accuracy_on": "test" if selecting("acc", rounds) == "acc" else "validation"}
    taken = sorted(r.get("times_sampled", 0) for r in records)
    median = taken[len(taken) // 2] if taken else 0
    groups = {"device": lambda r: kinds[r["client"]],
              "participation": lambda r: "never" if r["times_sampled"] == 0 else
              ("at_most_median" if r["times_sampled"] <= median else "above_median")}
    for name, group_of in groups.items():
        out[f"by_{name}"] = {key: {group: summarize([r[key] for r in records if group_of(r) == group])
                                   for group in sorted({group_of(r) for r in records})}
                             for key in ACCURACIES if records and key in records[0]}
    out["participation_median"] = median
    stale = [(c, s) for r in rounds for c, s in zip(r["participants"], r.get("staleness", ()))]
    if stale:  # asynchronous: how many server steps old each client's updates were
        out["staleness"] = summarize([s for _, s in stale], lower_is_better=True)
        out["per_client_staleness"] = {c: float(np.mean([s for k, s in stale if k == c])) for c in sorted({c for c, _ in stale})}
    return out
