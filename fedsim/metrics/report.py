"""Fairness report over run folders: accuracy spread across clients per round, final distributions,
communication totals, and a Markdown summary linking the figures.

This module writes report.md and names the figures; the runs are read in ``report_runs``, the tables built in
``report_tables`` and the figures drawn in ``report_figures``."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from fedsim.metrics.report_figures import (communication_png, comparison_png, distribution_png, fairness_png,
                                           seeds_png, time_png)
from fedsim.core.protocol import ACCURACIES
from fedsim.metrics.receipt import differences, receipt, receipt_table
from fedsim.metrics.report_runs import Run, load_run, seed_groups
from fedsim.metrics.report_tables import (accuracy_table, device_table, logged_table, mechanism_table, privacy_table,
                                          saving_lines, seed_table, selection_table, time_to_accuracy_table)
from fedsim.metrics.summary import times_to_accuracy


def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name)


def receipt_section(runs: list[Run]) -> list[str]:
    """What each run ran, from its stored config and the optimizers it set up (summary.json's: a module's own
    configure_optimizers does not read train.body / train.head), and the settings the runs differ in."""
    arms = [(run.name, receipt([run.config], [k for k in ACCURACIES if k in run.per_round], optimizers=run.optimizers))
            for run in runs]
    differ = differences([run.config for run in runs])
    return ["## Receipt", "", "What each run trained and scored, from its config.yaml and the optimizers it set up (its "
            "summary.json).", "", *receipt_table(arms), "",
            f"The runs differ in: {', '.join(differ) if differ else 'nothing but their seeds'}.", ""]


def write_report(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Write fairness_<run>.png per run, comparison.png, final_distribution.png, communication.png (when runs
    recorded bytes), sim_time.png (when runs ran on the virtual clock) and report.md into out_dir; return the
    written paths."""
    if not run_dirs:
        raise ValueError("write_report needs at least one run folder")
    runs = [load_run(Path(d)) for d in run_dirs]
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        raise ValueError(f"run names must differ (figures are named after them): {names}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(draw: Callable[..., None], filename: str, *args: Any) -> str:
        draw(*args, out_dir / filename)
        written.append(out_dir / filename)
        return filename

    md = ["# Fairness report", "", "## Final client accuracy", "", *accuracy_table(runs), "",
          "std in percentage points; p10 = 10th percentile over clients; worst10 = mean of the worst 10% of clients "
          "(at least one); Jain = (sum x)^2 / (n sum x^2), 1 = all clients equal; MB = 10^6 bytes in total.", "",
          "## The round each run is read at", "", "Picked on each run's validation split (data.validation): the round "
          "whose client-mean validation accuracy is highest, with test's accuracy there and at the final round. A run "
          "without a validation split has nothing to pick a round with: its best round on test is shown as the number "
          "PFLlib reports, not as a selection.", "", *selection_table(runs), "",
          f"![comparison]({save(comparison_png, 'comparison.png', runs)})", "",
          f"![final distribution]({save(distribution_png, 'final_distribution.png', runs)})", ""]
    groups = seed_groups(runs)
    if groups:
        md += ["## Across seeds", "", "Runs whose settings differ only in seed, grouped: the mean over seeds of the "
               "client-mean accuracy at the last round all seeds reached, with a Student-t 95% interval.", "",
               *seed_table(groups), "", f"![across seeds]({save(seeds_png, 'seeds.png', groups)})", ""]
    if any(run.logged for run in runs):
        md += ["## Logged by the modules and methods", "", "What each run's LightningModule logged with self.log and its "
               "method's client hook with ctx.record (its mechanism: APFL's alpha, Ditto's distance to the global "
               "model), per client at the last evaluated round (training values: the clients trained that round); p10 "
               "and worst10 on each metric's worse side (a loss's highest values: docs/configuration.md).", "",
               *logged_table(runs), ""]
    if any(run.mechanism for run in runs):
        md += ["## The methods' mechanism", "", "What each run's method recorded of its server-side mechanism after its "
               "server step (rounds.jsonl's mechanism: FedAMP's self-weights, IFCA's cluster sizes).", "",
               *mechanism_table(runs), ""]
    if any(run.spent for run in runs):
        md += ["## Privacy spent", "", "Each DP run's epsilon by its last recorded round, at the delta shown (local "
               "DP: the most frequent client's, and the median client's): docs/privacy.md says what it guarantees.", "",
               *privacy_table(runs), ""]
    with_comm = [run for run in runs if any(v is not None for v in run.comm.values())]
    if with_comm:
        md += ["## Communication", "", *saving_lines(with_comm), "",
               f"![communication]({save(communication_png, 'communication.png', with_comm)})", ""]
    timed = [run for run in runs if run.sim_time]
    if timed:
        totals = [f"{run.name}: {run.system.get('sim_seconds', max(run.sim_time.values())):.0f} s simulated, "
                  f"{run.system.get('dropouts', '-')} dropouts, {run.system.get('late', '-')} late reports"
                  for run in timed]
        md += ["## On the virtual clock", "", "; ".join(totals) + ".", "",
               f"![accuracy against simulated time]({save(time_png, 'sim_time.png', timed)})", "",
               *device_table(timed), ""]
        if any(times_to_accuracy(run.system) for run in timed):
            md += ["Time to accuracy (system.target_accuracy): when the clients' mean first reached each target.", "",
                   *time_to_accuracy_table(timed), ""]
    md += receipt_section(runs)
    md += ["## Per run", ""]
    for run in runs:
        png = save(fairness_png, f"fairness_{_slug(run.name)}.png", run)
        md += [f"### {run.name}", "", f"![fairness {run.name}]({png})", ""]
    (out_dir / "report.md").write_text("\n".join(md))
    return [*written, out_dir / "report.md"]
