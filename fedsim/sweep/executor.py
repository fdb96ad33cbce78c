"""Many runs at once on the current Ray cluster through Ray Tune: each run is one trial with a placement group of
one bundle per worker (trials share a cluster's GPUs by fraction), at most ``max_concurrent`` at a time, under
Tune's FIFO or ASHA scheduler.

A sweep is resumable by running it again: every run's own folder says whether it is finished (its trial only
replays it), interrupted (resumed from its checkpoint) or new; ``sweep.json`` in the sweep's folder remembers
the runs the scheduler stopped, so they stay stopped. Each run is claimed with a per-run lock for the whole
sweep, so two processes sharing a runs folder never train one run twice.

It runs past 350 lines because it is one job, a sweep's life against Tune (claim, schedule, stop, record,
resume): the pieces share the sweep's folder and state, and apart they would hand that state back and forth."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim import safe_files, storage
from fedsim.config import RunConfig, SearchConfig, results_fingerprint, validate
from fedsim.core.protocol import VALIDATION
from fedsim.engine.placement import worker_bundle
from fedsim.engine.ray_cluster import connect_ray, refuse_beyond_this_machine
from fedsim.errors import ConfigError
from fedsim.metrics.series import logged_series, metric_names, on_test, series_mode
from fedsim.plan import worker_count
from fedsim.sweep import ledger
from fedsim.sweep.runs import claimed, finished_summary, status
from fedsim.sweep.trial import FINISHED, TrialFailed, TrialRun, train

if TYPE_CHECKING:  # ray.tune is imported only by a sweep
    from ray.tune import Callback as TuneCallback

VERBS = {"run": "running", "resume": "resuming from its checkpoint", "overwrite": "its settings changed; running it again",
         "replay": "done before, replaying its rounds"}


@dataclass
class Outcome:
    """How a run of the sweep ended: finished, stopped (by the scheduler, at ``round``), failed (``cause``), or
    skipped (another process holds it)."""
    name: str
    state: str
    round: int | None = None
    cause: str = ""
    summary: dict | None = None


class Sweep:
    """The runs of one sweep, their folder (``out_dir/_sweeps/NAME``) and how Tune searches them."""

    def __init__(self, name: str, configs: Sequence[RunConfig], search: SearchConfig):
        self.name, self.search = name, search
        self.id = f"{name}-{hashlib.sha256(' '.join(c.name for c in configs).encode()).hexdigest()[:8]}"
        self.configs = [_tagged(cfg, f"sweep:{self.id}") for cfg in configs]
        self.folder = storage.join(configs[0].out_dir, "_sweeps", name)
        self.fingerprints = {cfg.name: results_fingerprint(cfg.model_dump()) for cfg in self.configs}

    def check(self) -> None:
        """Before any trial (and by --dry-run): the scheduler's metric, when named, is one every run reports."""
        if self.search.metric is None:
            if self.search.scheduler == "asha":
                raise ConfigError("search.metric: ASHA needs the per-round metric it compares, e.g. fairness/acc_p10")
            return
        if logged_series(self.search.metric):  # the module's own self.log value: known once it runs
            self._refuse_logged_off_validation(self.search.metric)
            return
        for cfg in self.configs:
            names = metric_names(cfg)
            if self.search.metric not in names:
                raise ConfigError(f"search.metric: {cfg.name} never reports {self.search.metric!r}; choose one of "
                                  f"{', '.join(names)}, or a value your module logs as NAME/STATISTIC (e.g. "
                                  "val_loss/mean)")
            twin = on_test(self.search.metric)
            if cfg.data.validation and twin is not None:
                raise ConfigError(f"search.metric: {self.search.metric} is scored on the test set, and ASHA would "
                                  f"select on it; {cfg.name} has data.validation: compare {twin}")

    def _refuse_logged_off_validation(self, metric: str) -> None:
        """Under data.validation, a logged value selects only where it was computed on the validation split: there a
        module's validation_step (and a method's scoring record) is named validation_NAME; any other name is test's
        (test_step, FedProto's prototype accuracy) or training's."""
        validated = next((cfg for cfg in self.configs if cfg.data.validation), None)
        if validated is not None and not metric.startswith(VALIDATION):
            raise ConfigError(f"search.metric: {metric} is not computed on the validation split (values logged there "
                              f"are named {VALIDATION}NAME; others come from test or training), and ASHA would select "
                              f"on it; {validated.name} has data.validation: compare fairness/{VALIDATION}acc_mean or "
                              f"a value your module's validation_step logs, as {VALIDATION}NAME/STATISTIC")

    @property
    def mode(self) -> str:
        """Whether ASHA keeps the trials with the highest metric or the lowest: search.mode, else the metric's own."""
        assert self.search.metric is not None, "Sweep.mode: only a scheduler that compares a metric asks"
        return self.search.mode or series_mode(self.search.metric)

    def stopped_runs(self, say: Callable[[str], None]) -> dict[str, dict]:
        """The runs the ledger says the scheduler stopped: only entries this sweep wrote for its runs' settings."""
        return ledger.read_stopped(self.folder, self.id, self.fingerprints, say)

    def remember_stopped(self, stopped: dict) -> None:
        ledger.write_stopped(self.folder, self.id, stopped)


def _tagged(cfg: RunConfig, tag: str) -> RunConfig:
    """W&B users find a sweep's runs by a tag (the run's results never depend on logging settings). out_dir is
    made absolute here, in the sweep's own process: each trial runs in a working directory of Tune's (where a
    relative out_dir would put the run), and where a run writes never changes its results."""
    tree = cfg.model_dump()
    tree["logging"]["wandb"]["tags"] = [*tree["logging"]["wandb"]["tags"], tag]
    tree["out_dir"] = storage.anchored(tree["out_dir"])
    return validate(tree)


def trial_bundles(cfg: RunConfig) -> list[dict[str, float]]:
    bundle = worker_bundle(cfg)
    if not bundle:
        raise ConfigError(f"engine.cpus_per_worker: {cfg.name}'s workers ask for no resources, so Tune cannot place "
                          "its trial; give engine.cpus_per_worker (or engine.gpus_per_worker) above 0")
    return [bundle] * worker_count(cfg)


def _need(cfg: RunConfig) -> dict[str, float]:
    bundles = trial_bundles(cfg)
    return {key: sum(b.get(key, 0.0) for b in bundles) for key in ("CPU", "GPU")}


def connect(configs: Sequence[RunConfig], max_concurrent: int | None) -> None:
    """Attach to RAY_ADDRESS, or start a local Ray with room (logical CPUs) for ``max_concurrent`` trials at once;
    then refuse what the cluster can never place, before any trial starts. A local Ray can never grow: a trial it
    cannot hold, or ``max_concurrent`` trials, is refused. An attached cluster may grow (its autoscaler adds
    nodes while a trial waits, as for ``fedsim run``): only an explicit ``max_concurrent`` beyond what it holds
    now is refused."""
    needs = sorted((_need(cfg) for cfg in configs), key=lambda n: (n["GPU"], n["CPU"]), reverse=True)
    at_once = min(max_concurrent or 1, len(configs))
    attached = bool(os.environ.get("RAY_ADDRESS"))
    for cfg in configs if not attached else ():
        refuse_beyond_this_machine(cfg)  # every variant's workers, before Ray is sized for the largest
    connect_ray(configs[0], cpus=sum(n["CPU"] for n in needs[:at_once]))
    import ray

    if attached and max_concurrent is None:
        return
    have = ray.cluster_resources()
    for key in ("CPU", "GPU"):
        one, wanted = needs[0][key], sum(n[key] for n in needs[:at_once])
        if one > have.get(key, 0) + 1e-9 and not attached:
            raise ConfigError(f"engine.workers: a trial needs {one:g} {key}, the Ray cluster has {have.get(key, 0):g}; "
                              f"lower engine.workers or engine.{'gpus' if key == 'GPU' else 'cpus'}_per_worker")
        if wanted > have.get(key, 0) + 1e-9:
            fit = sum(1 for i in range(len(needs)) if sum(n[key] for n in needs[:i + 1]) <= have.get(key, 0) + 1e-9)
            raise ConfigError(f"--max-concurrent: {at_once} trials at once need {wanted:g} {key}, the Ray cluster has "
                              f"{have.get(key, 0):g}; use --max-concurrent {max(fit, 1)}")


def _actions(configs: Sequence[RunConfig], stopped: dict, stack: ExitStack, say: Callable[[str], None],
             overwrite: bool = False) -> tuple[dict[str, TrialRun], list[Outcome]]:
    """Claim every run (held until the sweep ends) and decide what its trial does (``overwrite``: train every run
    anew, over whatever its folder holds)."""
    runs, skipped = {}, []
    for cfg in configs:
        if not stack.enter_context(claimed(cfg)):
            say(f"{cfg.name}: another process is running it, skipped")
            skipped.append(Outcome(cfg.name, "skipped", cause="another process holds it"))
            continue
        state = status(cfg)
        action = {"finished": "replay", "resumable": "resume", "changed": "overwrite", "new": "run"}[state]
        if overwrite and state != "new":
            action = "overwrite"
        elif cfg.name in stopped and state == "resumable":
            action = "replay"
        runs[cfg.name] = TrialRun(cfg, action, str(storage.user_dir()))
    return runs, skipped


def run_sweep(sweep: Sweep, max_concurrent: int | None = None, say: Callable[[str], None] = print, *,
              overwrite: bool = False, quiet: bool = False) -> list[Outcome]:
    """Bring every run of ``sweep`` to completion (or to the scheduler's stop) through Ray Tune; one line per
    trial as it starts (unless ``quiet``) and ends. ``overwrite``: every run trained anew, the scheduler's earlier
    stops forgotten. Returns each run's outcome, in the sweep's order."""
    from ray import tune

    sweep.check()
    stopped = {} if overwrite else sweep.stopped_runs(say)  # a malformed ledger is refused before Ray starts
    connect(sweep.configs, max_concurrent)
    with ExitStack() as stack:
        runs, outcomes = _actions(sweep.configs, stopped, stack, say, overwrite)
        if runs:
            trial_outcomes: dict[str, Outcome] = {}
            progress = _progress(sweep, runs, stopped, say if not quiet else None, say, trial_outcomes)
            stack.enter_context(_tune_quiet())
            tuner = tune.Tuner(
                tune.with_resources(tune.with_parameters(train, runs=runs),
                                    lambda params: _resources(runs[params["run"]].config)),
                param_space={"run": tune.grid_search(list(runs))},
                tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent, scheduler=_scheduler(sweep, runs),
                                            trial_name_creator=lambda t: t.config["run"],
                                            trial_dirname_creator=lambda t: t.config["run"]),
                run_config=tune.RunConfig(name=sweep.id, storage_path=_tune_storage(sweep), verbose=0,
                                          callbacks=[progress], failure_config=tune.FailureConfig(max_failures=0)))
            tuner.fit()
            outcomes += trial_outcomes.values()
    order = {cfg.name: i for i, cfg in enumerate(sweep.configs)}
    return sorted(outcomes, key=lambda o: order[o.name])


def _resources(cfg: RunConfig):
    from ray import tune

    # An empty head bundle: the trial's own process (the run's driver) waits on its workers and takes no CPU, as
    # `fedsim run`'s does; PACK keeps a trial's workers on as few nodes as possible.
    return tune.PlacementGroupFactory([{}, *trial_bundles(cfg)], strategy="PACK")


def _scheduler(sweep: Sweep, runs: dict[str, TrialRun]):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    search = sweep.search
    if search.scheduler == "fifo":
        return FIFOScheduler()
    return ASHAScheduler(time_attr="round", metric=search.metric, mode=sweep.mode, grace_period=search.grace_rounds,
                         reduction_factor=search.reduction_factor,
                         max_t=max(item.config.train.rounds for item in runs.values()))


def _tune_storage(sweep: Sweep) -> str:
    """Tune's own experiment files, beside the sweep's table: in its bucket when out_dir is one (Tune writes URIs
    through pyarrow, as fedsim does), so every node of a cluster reaches them."""
    if storage.is_uri(sweep.folder):
        return storage.join(sweep.folder, "tune")
    tune_folder = Path(sweep.folder, "tune")
    safe_files.refuse_linked_folder(tune_folder, Path(sweep.folder))  # Tune's state (tuner.pkl) would land elsewhere
    return str(tune_folder.resolve())


@contextmanager
def _tune_quiet() -> Iterator[None]:
    """Tune's console output off while the sweep runs, as Tune documents it: its legacy reporter at verbose=0 prints
    nothing (the new one prints its configuration box whatever the verbosity), and without its default loggers no
    TensorBoard files nor the hint to open them (fedsim reads its own run folders; W&B is its dashboard). A
    user's own setting of either wins; both are restored afterwards."""
    quiet = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}
    ours = [name for name in quiet if name not in os.environ]
    os.environ.update({name: quiet[name] for name in ours})
    try:
        yield
    finally:
        for name in ours:
            os.environ.pop(name, None)


def _progress(sweep: Sweep, runs: dict[str, TrialRun], stopped: dict, say_start: Callable[[str], None] | None,
              say: Callable[[str], None], outcomes: dict[str, Outcome]) -> TuneCallback:
    """A Tune callback (built lazily: ray.tune is imported only by a sweep): one line per trial start (None: not
    said) and end, and the outcome of each into ``outcomes``."""
    from ray.tune import Callback

    class Progress(Callback):
        # Everything it holds comes in as arguments, none from the enclosing call: cloudpickle pickles this local
        # class by value, and a closure over ``say`` would carry the printer that __getstate__ leaves out.
        def __init__(self, sweep: Sweep, runs: dict[str, TrialRun], stopped: dict,
                     say_start: Callable[[str], None] | None, say: Callable[[str], None],
                     outcomes: dict[str, Outcome]):
            self.sweep, self.runs, self.stopped, self.say, self.say_start = sweep, runs, stopped, say, say_start
            self.outcomes = outcomes

        def __getstate__(self) -> dict:
            # Tune pickles its callbacks into the experiment state for Tuner.restore, which fedsim never uses
            # (the run folders are a sweep's state). The printers stay out: once a Ray worker logs, Ray swaps
            # builtins.print for its tqdm-safe one, and the original `print` no longer pickles by name.
            return {**self.__dict__, "say": None, "say_start": None}

        def on_trial_start(self, iteration, trials, trial, **info):
            name = trial.config["run"]
            if self.say_start is not None:
                self.say_start(f"{name}: {VERBS[self.runs[name].action]}")

        def on_trial_complete(self, iteration, trials, trial, **info):
            name, last = trial.config["run"], trial.last_result or {}
            if last.get(FINISHED):
                self.outcomes[name] = Outcome(name, "finished", last.get("round"),
                                              summary=finished_summary(self.runs[name].config))
                self.say(f"{name}: finished ({_scores(last)})")
                return
            self.outcomes[name] = Outcome(name, "stopped", last.get("round"))
            if name not in self.stopped:
                self.stopped[name] = {"round": last.get("round"), "config": self.sweep.fingerprints[name],
                                      self.sweep.search.metric: last.get(self.sweep.search.metric)}
                self.sweep.remember_stopped(self.stopped)
            self.say(f"{name}: stopped by ASHA at round {last.get('round')} ({self.sweep.search.metric} "
                     f"{_number(last.get(self.sweep.search.metric))})")

        def on_trial_error(self, iteration, trials, trial, **info):
            name = trial.config["run"]
            cause = _cause(trial)
            self.outcomes[name] = Outcome(name, "failed", (trial.last_result or {}).get("round"), cause=cause)
            self.say(f"{name}: failed: {cause}")

    return Progress(sweep, runs, stopped, say_start, say, outcomes)


def _number(value: float | None) -> str:
    """A metric's value as a line shows it: 4 significant digits (61.8523 -> 61.85, 0.00123456 -> 0.001235)."""
    return "-" if value is None else f"{value:.4g}"


def _scores(last: dict) -> str:
    shown = [f"{label} {last[key]:.2f}%" for key, label in (("final/acc_mean", "initial"),
                                                            ("final/acc_personalized_mean", "personalized"))
             if key in last]
    return ", ".join(shown)


def _cause(trial) -> str:
    """The trial's own one-line cause: TrialFailed's message, else the error's type and first line."""
    err = None
    if trial.pickled_error_file and Path(trial.pickled_error_file).exists():  # written by Tune before callbacks run
        from ray import cloudpickle

        err = cloudpickle.loads(Path(trial.pickled_error_file).read_bytes())
    while (cause := getattr(err, "cause", None)) is not None:  # Ray's RayTaskError around the trial's exception
        err = cause
    if isinstance(err, TrialFailed):
        return str(err)
    if err is None:
        return "the trial ended with an error (see Tune's error.txt in the sweep's folder)"
    first = next((line for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first}"


def results_table(outcomes: Sequence[Outcome]) -> str:
    """Markdown: each run's outcome and, where finished, its clients' accuracies (percent) and time."""
    def pct(stats: dict | None, key: str) -> str:
        return f"{100 * stats[key]:.2f}" if stats else "-"

    lines = ["| run | outcome | initial mean | std | min | personalized mean | std | min | wall s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for o in outcomes:
        s = o.summary or {}
        a, p = s.get("acc"), s.get("acc_personalized")
        state = {"stopped": f"stopped at round {o.round}", "failed": f"failed: {o.cause}",
                 "skipped": f"skipped: {o.cause}"}.get(o.state, o.state)
        wall = f"{s['wall_seconds']:.1f}" if "wall_seconds" in s else "-"
        lines.append(f"| {o.name} | {state} | {pct(a, 'mean')} | {pct(a, 'std')} | {pct(a, 'min')} | "
                     f"{pct(p, 'mean')} | {pct(p, 'std')} | {pct(p, 'min')} | {wall} |")
    return "\n".join(lines)


def write_results(sweep: Sweep, outcomes: Sequence[Outcome]) -> str:
    """``results.md`` in the sweep's folder; returns where it is."""
    text = f"# Sweep {sweep.id}\n\n{results_table(outcomes)}\n"
    storage.Store(sweep.folder).write_bytes("results.md", text.encode())
    return storage.join(sweep.folder, "results.md")
