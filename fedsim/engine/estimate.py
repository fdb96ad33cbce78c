"""``fedsim run --dry-run``: validate a config, build its partition and model, and say how much work the run
is, without starting Ray or writing a run folder; given a ``Timer``, how long its training takes at the rate a few
of its steps measured on this machine.

Every count is exact, not sampled: client sampling, the evaluation rounds and the cohort are the run's plan
(:class:`~fedsim.plan.RunPlan`), the same object the server follows, so the rounds' samples are drawn here
exactly as the server will draw them."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedsim.algorithms import batchnorm_notice
from fedsim.config import RunConfig
from fedsim.data.array_dataset import about_line
from fedsim.engine.preflight import Rehearse, prepared
from fedsim.plan import RunPlan, steps_per_epoch
from fedsim.plan.privacy import describe_privacy

Timer = Callable[[RunPlan], float | None]
"""``timer(plan)``: the sample-steps per second one worker trains at on this machine (``fedsim.client.rehearsal.
throughput``; the engine never imports the client)."""


@dataclass(frozen=True)
class WorkEstimate:
    """What one run will compute and send. "Sample-steps" count images x passes (one forward and backward
    pass of one image); "SGD steps" count mini-batches."""
    name: str
    model: str
    client: str  # the LightningModule
    optimizers: tuple[str, ...]  # per param group: the parts it trains, its optimizer and settings
    own_optimizers: bool
    parameters: int  # trainable parameters of the whole model
    model_bytes: int  # the whole state dict (buffers included), as stored
    frozen_values: int  # values of the model that never train or travel (minilm's pretrained encoder)
    shared_values: int  # what the server holds and averages
    clients: int
    sampled_per_round: int
    rounds: int
    epochs_per_round: int  # passes over a sampled client's data, the method's extra epochs included
    train_sample_steps: int  # all rounds
    train_sgd_steps: int
    finetune_sample_steps: int  # evaluation: personalizing each scored client on its training data (eval.personalize)
    finetune_sgd_steps: int
    evaluation_rounds: int
    scored_test_images: int  # all evaluation rounds, before and after fine-tuning counted once each
    bytes_down_per_round: int
    bytes_up_per_round: int
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    clock: dict[str, Any] | None = None  # on the virtual clock: simulated seconds, selected and taking part per round
    packing: tuple[int | str, str | None] = (1, None)  # engine.pack as the run will use it, and why not if it cannot
    batchnorm: str | None = None  # the line saying DP chose model.batchnorm (local_statistics), or None
    method: str | None = None  # the line saying the method adjusted a shared setting (Algorithm.settings_notice)
    data: str | None = None  # how the data set was built (ArrayDataset.about's scalars: shakespeare's clients, text)
    poisson: bool = False  # train.sampling: poisson (round 1's draw is one draw, not every round's size)
    privacy: dict[str, Any] | None = None  # DP's accounting (RunPlan.privacy's summary): z, q, delta, epsilon at the final round
    per_worker: float | None = None  # sample-steps/s one worker trained at, timed on this machine (given a Timer)
    at_once: int = 1  # the workers that train at the same time here: as many as the cores hold at their threads

    @property
    def train_sample_steps_per_round(self) -> float:
        return self.train_sample_steps / self.rounds

    @property
    def seconds(self) -> float | None:
        """Training and fine-tuning at the timed rate, the workers in parallel; None where nothing was timed."""
        if not self.per_worker:
            return None
        return (self.train_sample_steps + self.finetune_sample_steps) / (self.per_worker * self.at_once)


def _training_work(plan: RunPlan, epochs: int) -> tuple[int, int]:
    """(sample-steps, SGD steps) over all rounds, from each round's actual sample."""
    samples = steps = 0
    for round_idx in range(1, plan.cfg.train.rounds + 1):
        for client in plan.sampled(round_idx):
            samples += plan.train_sizes[client] * epochs
            steps += plan.train_steps[client] * epochs
    return samples, steps


def _evaluation_work(plan: RunPlan) -> tuple[int, int, int, int]:
    """(evaluation rounds, fine-tuning sample-steps, fine-tuning SGD steps, test images scored) over the run."""
    cfg = plan.cfg
    if cfg.eval.personalize == "own_update":  # the method's own local update, at training's batch size
        batch, epochs = cfg.train.batch_size, plan.algorithm.epochs_per_round(cfg.train.local_epochs)
    else:
        batch, epochs = cfg.eval.finetune_batch_size or cfg.train.batch_size, cfg.eval.finetune_epochs
    rounds = [r for r in range(1, cfg.train.rounds + 1) if plan.evaluates(r)]
    samples = steps = scored = 0
    for round_idx in rounds:
        for client in plan.scored(round_idx):
            size = plan.train_sizes[client]
            samples += size * epochs
            steps += steps_per_epoch(size, batch) * epochs
            scored += plan.test_sizes[client] * (2 if epochs else 1)
    return len(rounds), samples, steps, scored


def checked_plan(cfg: RunConfig, rehearse: Rehearse | None = None, resume: bool = False,
                 overwrite: bool = False) -> RunPlan:
    """``cfg``'s plan, checked as a run checks it before Ray starts (``fedsim.engine.preflight``: inputs, run folder,
    and with ``rehearse`` a training step of the client module). Writes nothing beyond the data cache a real run
    fills too, and starts no Ray."""
    with prepared(cfg, resume, overwrite, rehearse) as ready:
        return ready.plan


def workers_at_once(cfg: RunConfig, workers: int) -> int:
    """How many of the run's workers train at the same time: each on a GPU of its own, else as many as this
    machine's cores hold at engine.threads_per_worker each (an estimate for a run on this machine)."""
    if cfg.engine.gpus_per_worker:
        return workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(workers, cores // cfg.engine.threads_per_worker))


def sample_steps_at(cfg: RunConfig, rounds: int) -> int:
    """The sample-steps (training and fine-tuning) of ``cfg`` run for ``rounds`` rounds: a search trial's settings
    as a final run (``tune.final_rounds``), counted as that run's plan draws them."""
    e = estimate(cfg.model_copy(update={"train": cfg.train.model_copy(update={"rounds": rounds})}), overwrite=True)
    return e.train_sample_steps + e.finetune_sample_steps


def estimate(cfg: RunConfig, rehearse: Rehearse | None = None, resume: bool = False,
             overwrite: bool = False, timer: Timer | None = None) -> WorkEstimate:
    """Check ``cfg`` as a run would (:func:`checked_plan`), then count its work; with ``timer``, time it too, where its
    workers train on CPUs: a GPU's rate is not this driver's CPU's, and a few of a paper-scale model's steps on a CPU
    took minutes (ResNet-34 at 224 px, over 10 min on this 2-core machine)."""
    with prepared(cfg, resume, overwrite, rehearse) as ready:
        plan, about = ready.plan, ready.inputs.data.about
    algorithm, shared = plan.algorithm, plan.model.layouts["shared"].size
    epochs = algorithm.epochs_per_round(cfg.train.local_epochs)
    train_samples, train_steps = _training_work(plan, epochs)
    evaluation_rounds, finetune_samples, finetune_steps, scored = _evaluation_work(plan)
    sampled = len(plan.sampled(1))
    down, up = plan.traffic_per_client
    return WorkEstimate(
        name=cfg.name, model=cfg.model.name if not cfg.model.client else plan.model.client, client=plan.model.client,
        optimizers=plan.model.optimizers, own_optimizers=plan.model.own_optimizers, parameters=plan.model.parameters, model_bytes=plan.model.state_bytes,
        frozen_values=plan.model.frozen,
        shared_values=shared, clients=plan.num_clients, sampled_per_round=sampled, rounds=cfg.train.rounds,
        epochs_per_round=epochs, train_sample_steps=train_samples, train_sgd_steps=train_steps,
        finetune_sample_steps=finetune_samples, finetune_sgd_steps=finetune_steps,
        evaluation_rounds=evaluation_rounds, scored_test_images=scored,
        bytes_down_per_round=down * sampled, bytes_up_per_round=up * sampled,
        workers=plan.workers, cpus_per_worker=cfg.engine.cpus_per_worker, gpus_per_worker=cfg.engine.gpus_per_worker,
        clock=_clock(plan), packing=plan.packing, poisson=plan.population.poisson,
        privacy=None if plan.privacy is None else plan.privacy.summary,
        batchnorm=batchnorm_notice(cfg, plan.algorithm, plan.model.keys),
        method=plan.algorithm.settings_notice(cfg.train), data=about_line(about),
        per_worker=timer(plan) if timer and not cfg.engine.gpus_per_worker else None,
        at_once=workers_at_once(cfg, plan.workers))


def _clock(plan: RunPlan) -> dict[str, Any] | None:
    """The virtual clock over the whole run (it depends on nothing a run computes, so a dry run knows it)."""
    if plan.clock is None:
        return None
    rounds = [plan.clock.round(r) for r in range(1, plan.cfg.train.rounds + 1)]
    return {"sim_seconds": rounds[-1].end_s, "selected": sum(len(t.selected) for t in rounds) / len(rounds),
            "participants": sum(len(t.participants) for t in rounds) / len(rounds),
            "dropouts": sum(len(t.dropouts) for t in rounds), "late": sum(len(t.late) for t in rounds)}


def _mb(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


def describe(e: WorkEstimate) -> str:
    """The estimate as the lines `fedsim run --dry-run` prints."""
    gpus = f", {e.gpus_per_worker:g} GPU" if e.gpus_per_worker else ""
    return "\n".join([
        f"{e.name}: ok (dry run: nothing started, nothing written)",
        f"  model        {e.model}: {e.parameters:,} parameters, {_mb(e.model_bytes)}; server holds "
        f"{e.shared_values:,} values"
        + (f"; {e.frozen_values:,} pretrained values frozen (never trained or sent)" if e.frozen_values else ""),
        f"  clients      {e.clients}, {e.sampled_per_round} {_per_round(e)}, "
        f"{e.rounds} rounds x "
        f"{e.epochs_per_round} epochs",
        f"  training     {e.train_sample_steps:,} sample-steps ({e.train_sample_steps_per_round:,.0f} per round), "
        f"{e.train_sgd_steps:,} SGD steps",
        f"  evaluation   at {e.evaluation_rounds} of the rounds: personalizing {e.finetune_sample_steps:,} sample-steps "
        f"({e.finetune_sgd_steps:,} SGD steps), {e.scored_test_images:,} test images scored",
        f"  client       {e.client}, optimizers "
        + ("from its configure_optimizers (train.body / train.head give only the round schedule)" if e.own_optimizers
           else "from train.body / train.head") + "".join(f"\n                 {line}" for line in e.optimizers),
        f"  traffic      per round {_mb(e.bytes_down_per_round)} down, {_mb(e.bytes_up_per_round)} up"
        + (" (round 1's participants)" if e.clock else ""),
        *([f"  clock        {e.rounds} rounds in {e.clock['sim_seconds']:,.0f} s simulated; per round "
           f"{e.clock['selected']:.1f} selected, {e.clock['participants']:.1f} took part (in all "
           f"{e.clock['dropouts']} dropouts, {e.clock['late']} late reports)"] if e.clock else []),
        f"  workers      {e.workers} x ({e.cpus_per_worker:g} CPU{gpus}): {e.workers * e.cpus_per_worker:g} CPU"
        + (f", {e.workers * e.gpus_per_worker:g} GPU" if e.gpus_per_worker else "") + " in all",
        f"  training as  {_packing(e.packing)}",
        *([f"  privacy      {describe_privacy(e.privacy)}"] if e.privacy else []),
        *([f"  batchnorm    {e.batchnorm}"] if e.batchnorm else []),
        *([f"  data         {e.data}"] if e.data else []),
        *([f"  method       {e.method}"] if e.method else []),
        *([f"  time         {time_line(e)}"] if e.seconds is not None or e.gpus_per_worker else []),
    ])


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def time_line(e: WorkEstimate) -> str:
    """The run's time at the rate a few of its steps measured here, said as the extrapolation it is."""
    if e.gpus_per_worker:
        return "time not estimated: its workers train on GPUs, which a dry run does not time"
    if e.seconds is None or e.per_worker is None:
        return "time not estimated (no client has training data to time)"
    return (f"about {duration(e.seconds)} of training and fine-tuning at the {e.per_worker:,.0f} sample-steps/s one "
            f"worker trained at here, {e.at_once} worker{'s' if e.at_once > 1 else ''} at once; Ray's "
            "start-up, scoring and aggregation come on top")


def total_time_line(estimates: list[WorkEstimate]) -> str:
    """Several runs one after another (a sweep's trials, a tune's runs): the sum of their timed estimates."""
    timed = [e.seconds for e in estimates if e.seconds is not None]
    if not timed:
        return "time: not estimated (nothing timed)"
    return (f"time: about {duration(sum(timed))} for these {len(timed)} runs one after another at the rates each "
            "timed here (runs at once on a cluster take less); Ray's start-up, scoring and aggregation come on top")


def _per_round(e: WorkEstimate) -> str:
    if e.clock:
        return "took part in round 1"
    return "drawn in round 1 (Poisson: each client with probability f)" if e.poisson else "sampled per round"


def _packing(packing: tuple[int | str, str | None]) -> str:
    size, notice = packing
    if notice:
        return notice
    if size == 1:
        return "one client after another on each worker"
    return ("packs sized by each worker on its device (engine.pack: auto)" if size == "auto"
            else f"packs of {size} clients on each worker") + " (docs/packed.md)"


def dry_run(configs: list[RunConfig], rehearse: Rehearse | None = None, resume: bool = False,
            overwrite: bool = False, timer: Timer | None = None) -> int:
    """Print every config's estimate; an invalid one raises the same one-line errors as a run."""
    estimates = []
    for cfg in configs:
        estimates.append(estimate(cfg, rehearse, resume, overwrite, timer))
        print(describe(estimates[-1]))
    if len(estimates) > 1:
        print(total_time_line(estimates))
    return 0

