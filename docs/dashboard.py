"""Draw docs/dashboard.md's charts from what fedsim logged to W&B, read back from the offline runs (W&B's server
is not reachable here): each chart is one a W&B user builds from the same keys.

    .venv/bin/python docs/dashboard.py RUN_DIR [RUN_DIR ...] [--out docs/images]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedsim.metrics.wandb_files import history, record, table  # noqa: E402


def offline_run(run_dir: Path) -> Path:
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    if not runs:
        raise SystemExit(f"{run_dir}: no offline W&B run (run it with logging.wandb.mode=offline)")
    return runs[-1]


def logged(run_dir: Path) -> dict:
    offline = offline_run(run_dir)
    rows = history(offline)
    per_round = [h for h in rows if "fairness/acc_mean" in h]
    [start] = [h for h in rows if "partition/clients/_type" in h]
    [end] = [h for h in rows if "clients/accuracy_table/_type" in h]
    return {"name": run_dir.name, "group": record(offline, "run").run_group, "rounds": per_round,
            "partition": table(offline, start, "partition/clients"), "clients": table(offline, end, "clients/accuracy_table")}


def fairness_chart(runs: list[dict], out: Path) -> Path:
    """fairness/acc_mean and fairness/acc_p10 over rounds, one colour per W&B group."""
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {}
    for run in runs:
        colour = colours.setdefault(run["group"], f"C{len(colours)}")
        rounds = [h["round"] for h in run["rounds"]]
        ax.plot(rounds, [h["fairness/acc_mean"] for h in run["rounds"]], color=colour, label=f"{run['name']} mean")
        ax.plot(rounds, [h["fairness/acc_p10"] for h in run["rounds"]], color=colour, ls="--", label=f"{run['name']} p10")
    ax.set(xlabel="round", ylabel="client accuracy (%)", title="fairness/acc_mean (solid) and fairness/acc_p10 (dashed)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    return _save(fig, out / "dashboard-fairness.png")


def every_client_chart(runs: list[dict], out: Path) -> Path:
    """clients/acc_chart: every client's accuracy over the rounds, one panel per run."""
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.6), sharey=True, squeeze=False)
    for ax, run in zip(axes[0], runs):
        by_client: dict[int, list[tuple[int, float]]] = {}
        for row in run["clients"]:
            by_client.setdefault(row["client"], []).append((row["round"], row["acc"]))
        for client, points in sorted(by_client.items()):
            ax.plot(*zip(*sorted(points)), lw=1, label=f"client {client}")
        ax.set(title=run["name"], xlabel="round")
    axes[0][0].set_ylabel("accuracy (%)")
    axes[0][-1].legend(fontsize=6, ncol=2)
    return _save(fig, out / "dashboard-every-client.png")


def partition_chart(run: dict, out: Path) -> Path:
    """partition/clients: each client's training images per class."""
    classes = sorted((k for k in run["partition"][0] if k.startswith("class_")), key=lambda k: int(k.split("_")[1]))
    counts = [[row[k] for k in classes] for row in run["partition"]]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    image = ax.imshow(counts, aspect="auto", cmap="viridis")
    ax.set(xlabel="class", ylabel="client", title=f"partition/clients ({run['name']})")
    fig.colorbar(image, ax=ax, label="training images")
    return _save(fig, out / "dashboard-partition.png")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "images")
    args = parser.parse_args()
    runs = [logged(run_dir) for run_dir in args.runs]
    for path in (fairness_chart(runs, args.out), every_client_chart(runs, args.out), partition_chart(runs[0], args.out)):
        print(path)


if __name__ == "__main__":
    main()
