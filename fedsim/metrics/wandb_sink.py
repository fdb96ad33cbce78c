"""Weights & Biases logging, a callback of the driver loop: the partition at start (a table of every client's
class counts), per round the ``fairness/`` statistics, loss and communication curves, a user module's
``self.log`` values, one curve per client and a table of that round's clients; at the end one chart of every
client's accuracy over the rounds (a line series built from the table of every round), the final client
table and histogram, and the run folder's summary files as an artifact.

Never needs a server: ``mode: offline`` writes ``RUN/wandb/offline-run-*`` for a later
``wandb sync``; ``online`` without an API key falls back to offline and says how to sync.
The API key is read from the environment (``WANDB_API_KEY``, e.g. a Ray job's ``runtime_env``) or
``~/.netrc`` and never written to the run folder. ``RUN/wandb_run.json`` keeps the W&B run id and the
last round logged: a resumed fedsim run continues the same W&B run and never logs a round twice.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim import safe_files, storage
from fedsim.config import WandbConfig
from fedsim.core import runfiles
from fedsim.core.protocol import RoundResult
from fedsim.core.results import read_results
from fedsim.engine.driver import Callback, Run
from fedsim.metrics.logger import round_row
from fedsim.metrics.series import dashboard_metrics, evaluated, fairness
from fedsim.metrics.wandb_files import wait_until_written

if TYPE_CHECKING:  # wandb itself is imported only when a run logs to it (~1 s)
    import wandb

ARTIFACT_FILES = (runfiles.SUMMARY, runfiles.ROUNDS_CSV, runfiles.ROUNDS, runfiles.PARTITION_STATS, runfiles.CONFIG)
X_AXES = {"round": "round", "sim_time": "sim/time_s"}  # logging.wandb.x_axis -> the step metric of every chart


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class WandbLogger(Callback):
    def __init__(self) -> None:
        self.run: wandb.Run | None = None  # the W&B run, once the fedsim run has started

    @property
    def wandb_run(self) -> wandb.Run:
        """The W&B run: on_run_start starts it before any other hook logs."""
        assert self.run is not None, "WandbLogger: a hook ran before on_run_start"
        return self.run

    def on_run_start(self, run: Run, done: int) -> None:
        import wandb

        cfg, run_dir, resume = run.plan.cfg, run.run_dir, run.resume
        wcfg: WandbConfig = cfg.logging.wandb
        mode = wcfg.mode
        if mode == "online" and not _has_api_key():
            print("fedsim: no W&B API key found; logging offline - upload later with "
                  f"`wandb sync {run_dir / runfiles.WANDB}/offline-run-*`", file=sys.stderr)
            mode = "offline"
        self.per_client_limit = wcfg.per_client_limit
        self.state_path = run_dir / runfiles.WANDB_RUN
        saved = json.loads(safe_files.read_text(self.state_path)) if resume and self.state_path.exists() else {}
        os.environ.setdefault("WANDB_SILENT", "true")
        # dir: an absolute path, so W&B's files land in the run folder whatever the process's working folder.
        self.run = wandb.init(project=wcfg.project, entity=wcfg.entity, group=wcfg.group or cfg.name,
                              job_type=cfg.algorithm.name, tags=wcfg.tags, name=cfg.name, config=cfg.model_dump(),
                              dir=str(run_dir.resolve()), mode=mode, id=wcfg.run_id or saved.get("id"),
                              resume="allow" if resume else None, reinit="finish_previous")
        for axis in dict.fromkeys(("round", X_AXES[wcfg.x_axis])):  # the round always, and the chosen x-axis
            self.wandb_run.define_metric(axis)
        self.wandb_run.define_metric("*", step_metric=X_AXES[wcfg.x_axis])
        self.mode = mode
        self.logged_through = saved.get("logged_through", 0)
        self.clock = cfg.system.devices is not None  # the run has simulated time to log
        self.classes = self._log_partition(run_dir, first=done == 0 and not saved)
        self.bytes_total = sum(r["bytes_up"] + r["bytes_down"] for r in read_results(run_dir / runfiles.ROUNDS)
                               if r["round"] <= done)
        self._save_state()
        run.extras["wandb"] = self.describe(run_dir, run.folder.location)

    def _log_partition(self, run_dir: Path, first: bool) -> list[int]:
        """The partition once, at the start of a run: every client's class counts as a table, and the spread of
        client sizes and of classes held. Returns each client's number of classes (the client tables' column)."""
        import wandb

        stats = json.loads(safe_files.read_text(run_dir / runfiles.PARTITION_STATS))
        classes = [len(held) for held in stats["classes_per_client"]]
        if first and "train_class_counts" in stats:  # a run folder written before fedsim counted classes has none
            counts = stats["train_class_counts"]
            columns: list[str | int] = ["client", "n_train", "n_test", "classes",
                                        *(f"class_{c}" for c in range(len(counts[0])))]
            rows = [[client, n, t, k, *row] for client, (n, t, k, row) in
                    enumerate(zip(stats["train_sizes"], stats["test_sizes"], classes, counts))]
            self.wandb_run.log({"partition/clients": wandb.Table(columns=columns, data=rows),
                                "partition/train_sizes": wandb.Histogram(stats["train_sizes"]),
                                "partition/classes_per_client": wandb.Histogram(classes), "round": 0,
                                **({"sim/time_s": 0.0} if self.clock else {})})
        return classes

    def _save_state(self) -> None:
        self.state_path.write_text(json.dumps({"id": self.wandb_run.id, "logged_through": self.logged_through}))

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        row, records = round_row(result), result.records
        if row["round"] <= self.logged_through:  # redone after a rollback or a resume: W&B has it already
            return
        data = dashboard_metrics(row) | self._losses(records)
        self.bytes_total += row["bytes_up"] + row["bytes_down"]
        data["comm/bytes_total"] = self.bytes_total
        # One key per client gives one curve per client in the W&B UI; beyond the limit, the tables carry every client.
        for r in records[: self.per_client_limit]:
            data[f"client_acc/{r['client']:05d}"] = r["acc"]
            if "acc_personalized" in r:
                data[f"client_acc_personalized/{r['client']:05d}"] = r["acc_personalized"]
        if evaluated(row):
            data["clients/round_table"] = self._client_table([{**r, "round": row["round"]} for r in records])
        self.wandb_run.log(data)
        self.logged_through = row["round"]
        self._save_state()

    @staticmethod
    def _losses(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Loss curves beside the accuracies: training loss of the clients trained this round, test (and validation)
        loss of all."""
        data = {}
        train_losses = [r["train_loss"] for r in records if r.get("train_loss") is not None]
        if train_losses:
            data["loss/train_mean"] = _mean(train_losses)
        for key, name in (("loss", "loss/test_mean"), ("loss_personalized", "loss/test_personalized_mean"),
                          ("validation_loss", "loss/validation_mean"), ("validation_loss_personalized", "loss/validation_personalized_mean")):
            if records and key in records[0]:
                data[name] = _mean([r[key] for r in records])
        return data

    def _client_table(self, records: list[dict]):
        """Client, round, size, classes held, accuracies (percent) and times sampled: one row per client and round."""
        import wandb

        columns: list[str | int] = ["client", "round", "n_train", "classes", "acc", "acc_personalized",
                                    "times_sampled"]
        rows = [[r["client"], r["round"], r["n_train"], self.classes[r["client"]], 100 * r["acc"],
                 100 * r["acc_personalized"] if "acc_personalized" in r else None, r.get("times_sampled")]
                for r in records]
        return wandb.Table(columns=columns, data=rows)

    def on_run_end(self, run: Run, error: BaseException | None) -> None:
        import wandb

        if self.run is None:  # the run broke before W&B started
            return
        summary, run_dir = run.summary, run.run_dir
        if summary:
            history = read_results(run_dir / runfiles.METRICS)  # every round, across resumes
            final = max(r["round"] for r in history)
            self.run.log({"clients/accuracy_table": self._client_table(history), **self._every_client(history),
                          "final/client_table": self._client_table([r for r in history if r["round"] == final]),
                          "final/client_acc_hist": wandb.Histogram([100 * r["acc"] for r in history
                                                                    if r["round"] == final])})
            for name, value in fairness(summary).items():
                self.run.summary[name.replace("fairness/", "final/", 1)] = value
            artifact = wandb.Artifact(f"{summary['name']}-summary", type="run-summary")
            for name in ARTIFACT_FILES:
                if (run_dir / name).exists():
                    artifact.add_file(str(run_dir / name))
            self.run.log_artifact(artifact)
        offline = Path(self.run.dir).parent  # RUN/wandb/offline-run-* (or run-* online): the log W&B writes
        self.run.finish(exit_code=0 if summary else 1)  # no summary: the run failed, and W&B marks it failed
        # The run folder is published (to a bucket, say) right after this: with W&B's log complete, not a header.
        if not wait_until_written(offline):
            print(f"fedsim: W&B had not finished writing {offline} after 30 s; the run folder is published without "
                  "waiting for it", file=sys.stderr)

    def _every_client(self, history: list[dict]) -> dict:
        """One chart of every client's accuracy over the rounds (up to logging.wandb.per_client_limit lines;
        clients/accuracy_table holds them all)."""
        import wandb

        rounds = sorted({r["round"] for r in history})
        charts = {}
        for key, title in (("acc", "accuracy"), ("acc_personalized", "personalized accuracy")):
            if key not in history[0]:
                continue
            by_client: dict[int, dict[int, float]] = {}
            for r in history:
                by_client.setdefault(r["client"], {})[r["round"]] = 100 * r[key]
            clients = sorted(by_client)[: self.per_client_limit]
            charts[f"clients/{key}_chart"] = wandb.plot.line_series(
                xs=rounds, ys=[[by_client[c].get(t) for t in rounds] for c in clients],
                keys=[f"client {c}" for c in clients], title=f"every client's {title} (%)", xname="round")
        return charts

    def describe(self, run_dir: Path, location: str) -> dict:
        """Where the W&B run lives, for the run summary (and the CLI's sync hint). ``location``: where the
        run folder ``run_dir`` is stored (itself, or a URI when it is a staging copy)."""
        inside = Path(self.wandb_run.dir).parent.resolve().relative_to(run_dir.resolve())
        folder = storage.join(location, *inside.parts)
        if self.mode != "offline":
            return {"mode": self.mode, "dir": folder, "url": self.wandb_run.url}
        if storage.is_uri(folder):
            sync = f"copy {folder} to this machine, then upload it with `wandb sync {inside.name}`"
        else:
            sync = f"upload with `wandb sync {folder}`"
        return {"mode": self.mode, "dir": folder, "sync": sync}
