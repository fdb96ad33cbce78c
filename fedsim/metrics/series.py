"""The per-round numbers a dashboard plots, under one set of names: W&B's charts and a Ray Tune trial's results
(so the metric a sweep's scheduler compares is a chart the user can open). Built from a round's row of
``rounds.jsonl``, so a resumed run replays its earlier rounds under the same names."""
from __future__ import annotations

from fedsim.config import RunConfig
from fedsim.core.protocol import ACCURACIES, RECORD_KEYS, SCORED, lower_is_better, on_validation
from fedsim.privacy import EPSILON, SPENT

STATS = ("mean", "std", "min", "max", "p10", "worst10_mean", "jain")  # fedsim.metrics.summarize's statistics
ROUND_KEYS = {"comm/bytes_up": "bytes_up", "comm/bytes_down": "bytes_down", "round_seconds": "seconds"}
CLOCK_KEYS = {"sim/time_s": "sim_time_s", "sim/round_seconds": "sim_seconds", "sim/selected": "selected"}  # system.devices
# Rows written before a key existed lack it (a resumed run replays them): shown where the row has it.
LATER_KEYS = {"round_cpu_seconds": "cpu_seconds"}
FEDSIM_PREFIXES = ("fairness/", "final/", "comm/", "sim/", "client_acc/", "round_seconds", "round_cpu_seconds",
                   "privacy/")  # fedsim's own series
NOT_LOGGED = {"round", "seconds", "cpu_seconds", "cpu_counted_once", "sampled", "evaluated", "dropped", "bytes_up",
              "bytes_down"}


def fairness(row: dict) -> dict[str, float]:
    """The across-client statistics of each accuracy under ``fairness/``, in the CLI's units: percent, and
    Jain's index as it is (1 = every client equal); validation's beside test's (``fairness/validation_acc_mean``)."""
    return {f"fairness/{key}_{stat}": value if stat == "jain" else 100 * value
            for key in SCORED for stat, value in row.get(key, {}).items()}


def round_metrics(row: dict) -> dict[str, float]:
    """A round's row as named series: traffic, wall and CPU time every round (and simulated time on the virtual clock); on evaluated rounds the fairness
    statistics and a user module's ``self.log`` values (``name/mean``, ..., in the module's units)."""
    data = {"round": row["round"], **{name: row[key] for name, key in ROUND_KEYS.items()}} | fairness(row)
    data |= {name: row[key] for keys in (CLOCK_KEYS, LATER_KEYS) for name, key in keys.items() if key in row}
    data |= {name: row[name] for name in SPENT if name in row}  # DP's epsilon spent so far, every round
    for key, stats in _logged_statistics(row).items():
        data |= {f"{key}/{stat}": value for stat, value in stats.items()}
    return data


def dashboard_metrics(row: dict) -> dict[str, float]:
    """:func:`round_metrics` for W&B's charts: a value every client logged alike this round (a learning rate, an
    epoch counter) is one curve, ``name/mean``; the spread across clients (std, p10, Jain, ...) is charted only for
    values that differ per client. (A Tune trial reports every statistic: a scheduler's metric is never missing.)"""
    data = round_metrics(row)
    for key, stats in _logged_statistics(row).items():
        if "min" in stats and stats["min"] == stats.get("max"):
            for stat in STATS[1:]:
                data.pop(f"{key}/{stat}", None)
    return data


def _logged_statistics(row: dict) -> dict[str, dict]:
    """The row's statistics of a module's own values (and of the method's and DP's per-round blocks)."""
    return {key: stats for key, stats in row.items()
            if key not in NOT_LOGGED and key not in ACCURACIES and key not in RECORD_KEYS and isinstance(stats, dict)}


def evaluated(row: dict) -> bool:
    """Whether the round scored its clients (every train.eval_every rounds and the last)."""
    return "acc" in row


def metric_names(cfg: RunConfig) -> list[str]:
    """The series every evaluated round of a run of ``cfg`` reports (a user module's own values come on top,
    known only once it logs them)."""
    accuracies = ["acc", *(["acc_personalized"] if cfg.eval.personalizes else [])]
    accuracies += [on_validation(key) for key in accuracies] if cfg.data.validation else []
    clock = [*CLOCK_KEYS] if cfg.system.devices is not None else []
    dp = cfg.privacy.dp if cfg.privacy is not None else "none"
    privacy = [] if dp == "none" else list(SPENT) if dp == "local" else [EPSILON]
    return [*ROUND_KEYS, *clock, *privacy, *(f"fairness/{key}_{stat}" for key in accuracies for stat in STATS)]


def on_test(metric: str) -> str | None:
    """A series of test accuracy (``fairness/acc_p10``): its twin on the validation split, which a selection reads
    instead; None for any other series."""
    prefix = "fairness/"
    if not metric.startswith(prefix) or not any(metric[len(prefix):].startswith(f"{key}_") for key in ACCURACIES):
        return None
    return prefix + on_validation(metric[len(prefix):])
def logged_series(name: str) -> bool:
    """Whether ``name`` names a series a user module's ``self.log`` value gives: ``<its name>/<statistic>``, e.g.
    ``val_loss/mean`` (which names a module logs is known only once it runs)."""
    key, _, stat = name.rpartition("/")
    return bool(key) and stat in STATS and not name.startswith(FEDSIM_PREFIXES)


def series_mode(name: str) -> str:
    """Which way the series ``name`` improves, for a scheduler comparing it: "min" for a lower-is-better metric's
    statistics (a loss: ``val_loss/mean``), for a spread (``std``), traffic and time; "max" for the rest (an
    accuracy and its worst clients, Jain's index)."""
    stat = name.rpartition("_")[2] if name.startswith(("fairness/", "final/")) else name.rpartition("/")[2]
    if name.startswith(("comm/", "sim/time_s", "sim/round_seconds", "round_seconds", "privacy/")) or stat == "std":
        return "min"
    return "max" if stat == "jain" or not lower_is_better(name) else "min"
