"""``fedsim run --dry-run``: validate a config, build its partition and model, and say how much work the run
is, without starting Ray or writing a run folder.

Every count is exact, not sampled: client sampling and the evaluation cohort are functions of the seed alone
(:func:`~fedsim.engine.server.sample_clients`, :func:`~fedsim.engine.server.evaluation_cohort`), so the
rounds' samples are drawn here exactly as the server will draw them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.algorithms import build_algorithm
from fedsim.client.runtime import initial_model, key_parts, model_layouts
from fedsim.config import RunConfig
from fedsim.data import Partition
from fedsim.engine.protocol import payload_bytes, serialized_size
from fedsim.engine.server import evaluation_cohort, sample_clients, steps_per_epoch
from fedsim.engine.simulation import prepare_inputs


@dataclass(frozen=True)
class WorkEstimate:
    """What one run will compute and send. "Sample-steps" count images x passes (one forward and backward
    pass of one image); "SGD steps" count mini-batches."""
    name: str
    model: str
    parameters: int  # trainable parameters of the whole model
    model_bytes: int  # the whole state dict (buffers included), as stored
    shared_values: int  # what the server holds and averages
    clients: int
    sampled_per_round: int
    rounds: int
    epochs_per_round: int  # passes over a sampled client's data, the method's extra epochs included
    train_sample_steps: int  # all rounds
    train_sgd_steps: int
    finetune_sample_steps: int  # evaluation: eval.finetune_epochs on each scored client's training data
    finetune_sgd_steps: int
    evaluation_rounds: int
    scored_test_images: int  # all evaluation rounds, before and after fine-tuning counted once each
    bytes_down_per_round: int
    bytes_up_per_round: int
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float

    @property
    def train_sample_steps_per_round(self) -> float:
        return self.train_sample_steps / self.rounds


def _evaluation_rounds(cfg: RunConfig) -> list[int]:
    """As Server._evaluates: every train.eval_every rounds and always the final one."""
    return [r for r in range(1, cfg.train.rounds + 1) if r % cfg.train.eval_every == 0 or r == cfg.train.rounds]


def _scored_clients(cfg: RunConfig, round_idx: int, cohort: list[int], num_clients: int) -> list[int]:
    """As Server._evaluated_clients: the cohort, but every client at the final round and every eval.full_every."""
    every = cfg.eval.full_every
    if round_idx == cfg.train.rounds or (every and round_idx % every == 0):
        return list(range(num_clients))
    return cohort


def _training_work(cfg: RunConfig, sizes: np.ndarray, epochs: int) -> tuple[int, int]:
    """(sample-steps, SGD steps) over all rounds, from each round's actual sample."""
    batch = cfg.train.batch_size
    samples = steps = 0
    for round_idx in range(1, cfg.train.rounds + 1):
        for client in sample_clients(cfg.seed, round_idx, len(sizes), cfg.train.fraction):
            samples += int(sizes[client]) * epochs
            steps += steps_per_epoch(int(sizes[client]), batch) * epochs
    return samples, steps


def _evaluation_work(cfg: RunConfig, partition: Partition) -> tuple[int, int, int]:
    """(fine-tuning sample-steps, fine-tuning SGD steps, test images scored) over all evaluation rounds."""
    n = partition.num_clients
    cohort = evaluation_cohort(cfg.seed, n, cfg.eval.clients)
    batch = cfg.eval.finetune_batch_size or cfg.train.batch_size
    samples = steps = scored = 0
    for round_idx in _evaluation_rounds(cfg):
        for client in _scored_clients(cfg, round_idx, cohort, n):
            size = len(partition.train[client])
            samples += size * cfg.eval.finetune_epochs
            steps += steps_per_epoch(size, batch) * cfg.eval.finetune_epochs
            scored += len(partition.test[client]) * (2 if cfg.eval.finetune_epochs else 1)
    return samples, steps, scored


def estimate(cfg: RunConfig) -> WorkEstimate:
    """Validate ``cfg`` as a run would (data, partition, model), then count its work. Writes nothing
    beyond the data cache a real run fills too, and starts no Ray."""
    data, partition, init_weights = prepare_inputs(cfg)
    algorithm = build_algorithm(cfg)
    net = initial_model(cfg, algorithm, data.num_classes, data.input_shape, init_weights)
    shared = model_layouts(algorithm, net, key_parts(net, cfg.model.personal_layers))["shared"].size
    sizes = np.array([len(t) for t in partition.train])
    epochs = algorithm.epochs_per_round(cfg.train.local_epochs)
    train_samples, train_steps = _training_work(cfg, sizes, epochs)
    finetune_samples, finetune_steps, scored = _evaluation_work(cfg, partition)
    sampled = len(sample_clients(cfg.seed, 1, partition.num_clients, cfg.train.fraction))
    # As the server and workers account traffic: the broadcast's pickled size, a float32 vector per upload.
    down = sum(serialized_size(np.zeros(shared, np.float32)) for _ in algorithm.broadcast)
    up = sum(payload_bytes(shared) for _ in algorithm.uploads)
    return WorkEstimate(
        name=cfg.name, model=cfg.model.name, parameters=sum(p.numel() for p in net.parameters()),
        model_bytes=sum(t.numel() * t.element_size() for t in net.state_dict().values()),
        shared_values=shared, clients=partition.num_clients, sampled_per_round=sampled, rounds=cfg.train.rounds,
        epochs_per_round=epochs, train_sample_steps=train_samples, train_sgd_steps=train_steps,
        finetune_sample_steps=finetune_samples, finetune_sgd_steps=finetune_steps,
        evaluation_rounds=len(_evaluation_rounds(cfg)), scored_test_images=scored,
        bytes_down_per_round=down * sampled, bytes_up_per_round=up * sampled,
        workers=min(cfg.engine.workers, partition.num_clients), cpus_per_worker=cfg.engine.cpus_per_worker,
        gpus_per_worker=cfg.engine.gpus_per_worker)


def _mb(value: int) -> str:
    return f"{value / 2**20:,.1f} MiB"


def describe(e: WorkEstimate) -> str:
    """The estimate as the lines `fedsim run --dry-run` prints."""
    gpus = f", {e.gpus_per_worker:g} GPU" if e.gpus_per_worker else ""
    return "\n".join([
        f"{e.name}: ok (dry run: nothing started, nothing written)",
        f"  model        {e.model}: {e.parameters:,} parameters, {_mb(e.model_bytes)}; server holds "
        f"{e.shared_values:,} values",
        f"  clients      {e.clients}, {e.sampled_per_round} sampled per round, {e.rounds} rounds x "
        f"{e.epochs_per_round} epochs",
        f"  training     {e.train_sample_steps:,} sample-steps ({e.train_sample_steps_per_round:,.0f} per round), "
        f"{e.train_sgd_steps:,} SGD steps",
        f"  evaluation   at {e.evaluation_rounds} of the rounds: fine-tuning {e.finetune_sample_steps:,} sample-steps "
        f"({e.finetune_sgd_steps:,} SGD steps), {e.scored_test_images:,} test images scored",
        f"  traffic      per round {_mb(e.bytes_down_per_round)} down, {_mb(e.bytes_up_per_round)} up",
        f"  workers      {e.workers} x ({e.cpus_per_worker:g} CPU{gpus}): {e.workers * e.cpus_per_worker:g} CPU"
        + (f", {e.workers * e.gpus_per_worker:g} GPU" if e.gpus_per_worker else "") + " in all",
    ])


def dry_run(configs: list[RunConfig]) -> int:
    """Print every config's estimate; an invalid one raises the same one-line errors as a run."""
    for cfg in configs:
        print(describe(estimate(cfg)))
    return 0

