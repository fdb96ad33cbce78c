"""``fedsim run --dry-run``: validate a config, build its partition and model, and say how much work the run
is, without starting Ray or writing a run folder.

Every count is exact, not sampled: client sampling, the evaluation rounds and the cohort are the run's plan
(:class:`~fedsim.plan.RunPlan`), the same object the server follows, so the rounds' samples are drawn here
exactly as the server will draw them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedsim.algorithms import batchnorm_notice
from fedsim.config import RunConfig
from fedsim.engine.preflight import Rehearse, prepared
from fedsim.plan import RunPlan, steps_per_epoch
from fedsim.plan.privacy import describe_privacy


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
    poisson: bool = False  # train.sampling: poisson (round 1's draw is one draw, not every round's size)
    privacy: dict[str, Any] | None = None  # DP's accounting (RunPlan.privacy_summary): z, q, delta, epsilon at the final round

    @property
    def train_sample_steps_per_round(self) -> float:
        return self.train_sample_steps / self.rounds


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


def estimate(cfg: RunConfig, rehearse: Rehearse | None = None, resume: bool = False,
             overwrite: bool = False) -> WorkEstimate:
    """Check ``cfg`` as a run would (:func:`checked_plan`), then count its work."""
    plan = checked_plan(cfg, rehearse, resume, overwrite)
    algorithm, shared = plan.algorithm, plan.model.layouts["shared"].size
    epochs = algorithm.epochs_per_round(cfg.train.local_epochs)
    train_samples, train_steps = _training_work(plan, epochs)
    evaluation_rounds, finetune_samples, finetune_steps, scored = _evaluation_work(plan)
    sampled = len(plan.sampled(1))
    down, up = plan.traffic_per_client
    return WorkEstimate(
        name=cfg.name, model=cfg.model.name if not cfg.model.client else plan.model.client, client=plan.model.client,
        optimizers=plan.model.optimizers, own_optimizers=plan.model.own_optimizers, parameters=plan.model.parameters, model_bytes=plan.model.state_bytes,
        shared_values=shared, clients=plan.num_clients, sampled_per_round=sampled, rounds=cfg.train.rounds,
        epochs_per_round=epochs, train_sample_steps=train_samples, train_sgd_steps=train_steps,
        finetune_sample_steps=finetune_samples, finetune_sgd_steps=finetune_steps,
        evaluation_rounds=evaluation_rounds, scored_test_images=scored,
        bytes_down_per_round=down * sampled, bytes_up_per_round=up * sampled,
        workers=plan.workers, cpus_per_worker=cfg.engine.cpus_per_worker, gpus_per_worker=cfg.engine.gpus_per_worker,
        clock=_clock(plan), packing=plan.packing, poisson=plan.population.poisson, privacy=plan.privacy_summary,
        batchnorm=batchnorm_notice(cfg, plan.algorithm, plan.model.keys),
        method=plan.algorithm.settings_notice(cfg.train))


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
        f"{e.shared_values:,} values",
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
        *([f"  method       {e.method}"] if e.method else []),
    ])


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
            overwrite: bool = False) -> int:
    """Print every config's estimate; an invalid one raises the same one-line errors as a run."""
    for cfg in configs:
        print(describe(estimate(cfg, rehearse, resume, overwrite)))
    return 0

