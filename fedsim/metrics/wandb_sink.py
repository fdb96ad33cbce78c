"""Weights & Biases logging, a callback of the driver loop: summary curves (accuracies and losses), one
accuracy curve per client, final histogram, artifact.

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
from pathlib import Path

from fedsim import storage
from fedsim.config import WandbConfig
from fedsim.core.protocol import ACCURACIES, RoundResult, logged_keys
from fedsim.engine.driver import Callback, Run
from fedsim.metrics.logger import round_row

ARTIFACT_FILES = ("summary.json", "rounds.csv", "rounds.jsonl", "partition_stats.json", "config.yaml")
STATE_FILE = "wandb_run.json"


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def fairness(row: dict) -> dict[str, float]:
    """The across-client statistics of each accuracy under ``fairness/``, in the CLI's units: percent, and
    Jain's index as it is (1 = every client equal)."""
    return {f"fairness/{key}_{stat}": value if stat == "jain" else 100 * value
            for key in ACCURACIES for stat, value in row.get(key, {}).items()}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class WandbLogger(Callback):
    def __init__(self) -> None:
        self.run = None  # the W&B run, once the fedsim run has started

    def on_run_start(self, run: Run, done: int) -> None:
        import wandb

        cfg, run_dir, resume = run.plan.cfg, run.run_dir, run.resume
        wcfg: WandbConfig = cfg.logging.wandb
        mode = wcfg.mode
        if mode == "online" and not _has_api_key():
            print("fedsim: no W&B API key found; logging offline - upload later with "
                  f"`wandb sync {run_dir / 'wandb'}/offline-run-*`", file=sys.stderr)
            mode = "offline"
        self.per_client_limit = wcfg.per_client_limit
        self.state_path = run_dir / STATE_FILE
        saved = json.loads(self.state_path.read_text()) if resume and self.state_path.exists() else {}
        os.environ.setdefault("WANDB_SILENT", "true")
        # dir: an absolute path, so W&B's files land in the run folder whatever the process's working folder.
        self.run = wandb.init(project=wcfg.project, entity=wcfg.entity, group=wcfg.group or cfg.name,
                              job_type=cfg.algorithm.name, tags=wcfg.tags, name=cfg.name, config=cfg.model_dump(),
                              dir=str(run_dir.resolve()), mode=mode, id=wcfg.run_id or saved.get("id"),
                              resume="allow" if resume else None, reinit="finish_previous")
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")
        self.mode = mode
        self.logged_through = saved.get("logged_through", 0)
        self._save_state()
        run.extras["wandb"] = self.describe(run_dir, run.folder.location)

    def _save_state(self) -> None:
        self.state_path.write_text(json.dumps({"id": self.run.id, "logged_through": self.logged_through}))

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        row, records = round_row(result), result.records
        if row["round"] <= self.logged_through:  # redone after a rollback or a resume: W&B has it already
            return
        data = {"round": row["round"], "comm/bytes_up": row["bytes_up"], "comm/bytes_down": row["bytes_down"],
                "round_seconds": row["seconds"]}
        data |= fairness(row)
        for key in logged_keys(records):  # the module's own self.log values, in its units
            for stat, value in row.get(key, {}).items():
                data[f"{key}/{stat}"] = value
        # Loss curves beside the accuracies: training loss of the clients trained this round, test loss of all.
        train_losses = [r["train_loss"] for r in records if r.get("train_loss") is not None]
        if train_losses:
            data["loss/train_mean"] = _mean(train_losses)
        for key, name in (("loss", "loss/test_mean"), ("loss_personalized", "loss/test_personalized_mean")):
            if records and key in records[0]:
                data[name] = _mean([r[key] for r in records])
        # One key per client gives one curve per client in the W&B UI; beyond the limit, the table at
        # the end carries every client.
        for r in records[: self.per_client_limit]:
            data[f"client_acc/{r['client']:05d}"] = r["acc"]
            if "acc_personalized" in r:
                data[f"client_acc_personalized/{r['client']:05d}"] = r["acc_personalized"]
        self.run.log(data)
        self.logged_through = row["round"]
        self._save_state()

    def on_run_end(self, run: Run, error: BaseException | None) -> None:
        import wandb

        if self.run is None:  # the run broke before W&B started
            return
        summary, run_dir = run.summary, run.run_dir
        if summary:
            accs = summary["per_client_acc"]
            table = wandb.Table(columns=["client", "acc"], data=[[int(c), a] for c, a in accs.items()])
            self.run.log({"final/client_acc_hist": wandb.Histogram(list(accs.values())),
                          "final/client_acc_table": table})
            for name, value in fairness(summary).items():
                self.run.summary[name.replace("fairness/", "final/", 1)] = value
            artifact = wandb.Artifact(f"{summary['name']}-summary", type="run-summary")
            for name in ARTIFACT_FILES:
                if (run_dir / name).exists():
                    artifact.add_file(str(run_dir / name))
            self.run.log_artifact(artifact)
        self.run.finish(exit_code=0 if summary else 1)  # no summary: the run failed, and W&B marks it failed

    def describe(self, run_dir: Path, location: str) -> dict:
        """Where the W&B run lives, for the run summary (and the CLI's sync hint). ``location``: where the
        run folder ``run_dir`` is stored (itself, or a URI when it is a staging copy)."""
        inside = Path(self.run.dir).parent.resolve().relative_to(run_dir.resolve())
        folder = storage.join(location, *inside.parts)
        if self.mode != "offline":
            return {"mode": self.mode, "dir": folder, "url": self.run.url}
        if storage.is_uri(folder):
            sync = f"copy {folder} to this machine, then upload it with `wandb sync {inside.name}`"
        else:
            sync = f"upload with `wandb sync {folder}`"
        return {"mode": self.mode, "dir": folder, "sync": sync}
