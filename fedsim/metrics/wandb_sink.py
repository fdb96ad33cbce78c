"""Weights & Biases logging: summary curves, one accuracy curve per client, final histogram, artifact.

Never needs a server: ``mode: offline`` writes ``RUN/wandb/offline-run-*`` for a later
``wandb sync``; ``online`` without an API key falls back to offline and says how to sync.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from fedsim.config import RunConfig, WandbConfig

ARTIFACT_FILES = ("summary.json", "rounds.csv", "rounds.jsonl", "partition_stats.json", "config.yaml")


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class WandbSink:
    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool = False):
        import wandb

        wcfg: WandbConfig = cfg.logging.wandb
        mode = wcfg.mode
        if mode == "online" and not _has_api_key():
            print("fedsim: no W&B API key found; logging offline - upload later with "
                  f"`wandb sync {run_dir / 'wandb'}/offline-run-*`", file=sys.stderr)
            mode = "offline"
        self.per_client_limit = wcfg.per_client_limit
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=wcfg.project, entity=wcfg.entity, group=wcfg.group, tags=wcfg.tags,
                              name=cfg.name, config=cfg.model_dump(), dir=str(run_dir), mode=mode,
                              id=wcfg.run_id, resume="allow" if resume else None, reinit="finish_previous")
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")
        self.mode = mode

    def log_round(self, row: dict, records: list[dict]) -> None:
        data = {"round": row["round"], "comm/bytes_up": row["bytes_up"], "comm/bytes_down": row["bytes_down"],
                "round_seconds": row["seconds"]}
        for key in ("acc", "acc_personalized"):
            for stat, value in row.get(key, {}).items():
                data[f"{key}/{stat}"] = value
        # One key per client gives one curve per client in the W&B UI; beyond the limit, the table at
        # the end carries every client.
        for r in records[: self.per_client_limit]:
            data[f"client_acc/{r['client']:05d}"] = r["acc"]
            if "acc_personalized" in r:
                data[f"client_acc_personalized/{r['client']:05d}"] = r["acc_personalized"]
        self.run.log(data)

    def finish(self, summary: dict | None, run_dir: Path) -> None:
        import wandb

        if summary:
            accs = summary["per_client_acc"]
            table = wandb.Table(columns=["client", "acc"], data=[[int(c), a] for c, a in accs.items()])
            self.run.log({"final/client_acc_hist": wandb.Histogram(list(accs.values())),
                          "final/client_acc_table": table})
            for key in ("acc", "acc_personalized"):
                for stat, value in summary.get(key, {}).items():
                    self.run.summary[f"final/{key}/{stat}"] = value
            artifact = wandb.Artifact(f"{summary['name']}-summary", type="run-summary")
            for name in ARTIFACT_FILES:
                if (run_dir / name).exists():
                    artifact.add_file(str(run_dir / name))
            self.run.log_artifact(artifact)
        self.run.finish()

    def describe(self) -> dict:
        """Where the W&B run lives, for the run summary (and the CLI's sync hint)."""
        run_folder = Path(self.run.dir).parent
        return {"mode": self.mode, "dir": str(run_folder),
                **({"sync": f"wandb sync {run_folder}"} if self.mode == "offline" else {"url": self.run.url})}
