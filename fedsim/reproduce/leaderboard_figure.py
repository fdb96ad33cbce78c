"""The leaderboard's figure: per setting, each row's accuracy over the rounds (the mean over its finished final
seeds at each evaluated round), with the final round's 95% interval, so the page shows whether the order still moves
at its budget."""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure


def curves_figure(table: dict, titles: dict[str, str], path: Path) -> bool:
    """Draw the figure to ``path``; False (nothing drawn, an old figure removed) where no row has a finished seed."""
    drawn = {setting: {row: cell["finals"] for row, cell in cells.items() if "final" in cell["finals"]}
             for setting, cells in table.items()}
    if not any(drawn.values()):
        path.unlink(missing_ok=True)  # a figure of runs that are gone would outlive its numbers
        return False
    fig = Figure(figsize=(8.4 * len(drawn), 4.6), layout="constrained")
    for ax, (setting, rows) in zip(fig.subplots(1, len(drawn), squeeze=False)[0], drawn.items()):
        for i, (row, stats) in enumerate(rows.items()):
            rounds = sorted(stats["curve"], key=int)
            line, = ax.plot([int(r) for r in rounds], [stats["curve"][r] for r in rounds], marker="o",
                            color=f"C{i % 10}", label=f"{row} ({stats['seeds']} seeds)")
            final = stats["final"]
            if final["low"] is not None:
                last = int(rounds[-1])
                below, above = final["mean"] - final["low"], final["high"] - final["mean"]
                ax.errorbar([last], [final["mean"]], yerr=[[below], [above]], color=line.get_color(), capsize=4)
        ax.set(xlabel="round", ylabel="reported test accuracy (%), mean over clients and seeds", title=titles[setting])
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # off the intervals at R
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return True
