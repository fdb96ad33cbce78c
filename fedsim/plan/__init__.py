"""A run's plan: everything derivable from its config, data and partition, built once on the driver
(:func:`fedsim.plan.build.build_plan`) and handed to the server, the workers and ``--dry-run``'s estimate.

It holds the method, the model's layouts and round-0 values, each client's data, the lr schedule, the
clients sampled each round, the evaluation rounds and cohort, and which worker owns which client. Every
schedule here is a pure function of the seed and the config, never of the number of workers, which is why
results do not depend on how a run is spread.

This module imports no torch: the server's process receives the plan too. It runs past ~350 lines because every
derived value the server, the workers and the estimate read lives here, once (privacy's included: the noise
multiplier, the epsilon series, the masks' cohort), rather than recomputed where it is read."""
from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from fedsim.algorithms.base import Algorithm
from fedsim.config import EvalConfig, RunConfig, resume_fingerprint
from fedsim.core.layout import KeyParts, Layout
from fedsim.core.protocol import ClientData, arrays_bytes, payload_bytes
from fedsim.core.robust import fewest_replies
from fedsim.errors import ConfigError
from fedsim.plan.async_clock import AsyncClock
from fedsim.plan.system import Clock, RoundTime, SystemModel
from fedsim.privacy.mechanism import UserLevelDP, user_level_dp
from fedsim.privacy.secagg import PairwiseMasks

if TYPE_CHECKING:
    from fedsim.privacy.accountant import Accounting

POISSON_STREAM = 0x9015  # train.sampling: poisson's draws, a stream apart from the fixed sampler's (0x5A3)


def cohort_size(fraction: float, population: int) -> int:
    """The fixed sampler's clients a round: max(1, round(f x N)) of the N that may train."""
    return max(1, round(fraction * population))


def sample_clients(seed: int, round_idx: int, num_clients: int, fraction: float,
                   pool: np.ndarray | None = None) -> list[int]:
    """max(1, round(f * N)) distinct clients, drawn from (seed, round) only; with ``pool`` (the clients that may
    train, eval.unseen held out) f of the pool, from it. Drawing from the whole range or from a pool holding all
    of it gives the same clients."""
    candidates = num_clients if pool is None else pool
    count = cohort_size(fraction, num_clients if pool is None else len(pool))
    rng = np.random.default_rng([seed, round_idx, 0x5A3])
    return sorted(int(c) for c in rng.choice(candidates, size=count, replace=False))


def poisson_clients(seed: int, round_idx: int, num_clients: int, fraction: float,
                    pool: np.ndarray | None = None) -> list[int]:
    """train.sampling: poisson: each client of the pool joins with probability f, independently, from (seed, round)
    only; possibly nobody (the round trains no one, the server keeps its state, the accountant counts the round)."""
    candidates = np.arange(num_clients) if pool is None else pool
    rng = np.random.default_rng([seed, round_idx, POISSON_STREAM])
    return [int(c) for c in candidates[rng.random(len(candidates)) < fraction]]


def held_out_clients(seed: int, num_clients: int, evaluation: EvalConfig) -> list[int]:
    """eval.unseen: the clients that never train, drawn once from the seed alone (their count checked with the
    config: :func:`fedsim.config.checks.check_population`)."""
    count = evaluation.held_out(num_clients)
    if not count:
        return []
    rng = np.random.default_rng([seed, 0x0B5E])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def evaluation_cohort(seed: int, num_clients: int, clients: int | float | None) -> list[int]:
    """eval.clients: the clients scored on evaluation rounds, drawn once from the seed alone, so the curve
    follows the same clients every round and for any number of workers."""
    count = num_clients if clients is None else clients if isinstance(clients, int) else round(clients * num_clients)
    count = min(max(count, 1), num_clients)
    if count == num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng([seed, 0xC0407])
    return sorted(int(c) for c in rng.choice(num_clients, size=count, replace=False))


def balanced_owners(costs: Sequence[int], workers: int) -> list[int]:
    """Item -> worker, balanced by cost: longest first onto the least-loaded worker, ties to the lower
    index. Which worker runs a client never changes results (all randomness is per (seed, round,
    client)); it only sets how long each round waits for its slowest worker."""
    load, owners = [0] * workers, [0] * len(costs)
    for client in sorted(range(len(costs)), key=lambda c: (-costs[c], c)):
        worker = min(range(workers), key=lambda w: (load[w], w))
        owners[client] = worker
        load[worker] += costs[client]
    return owners


def worker_count(cfg: RunConfig) -> int:
    """The workers a run starts: engine.workers, but no more than there are clients (a worker without clients would
    only hold resources). What the run reserves, places and asks a local Ray to hold."""
    return min(cfg.engine.workers, cfg.data.num_clients)


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """A client's SGD steps per local epoch: the cost that client -> worker balancing evens out."""
    return math.ceil(n_train / batch_size)


@dataclass(frozen=True)
class ModelPlan:
    """The run's round-0 model as flat vectors: built once from the seed (and model.init_from), so every
    worker starts from exactly these values instead of building and initialising its own."""
    layouts: dict[str, Layout]  # "shared" (what the server holds), "personal" (the rest), "full" (everything)
    initial: dict[str, np.ndarray]  # each layout's round-0 values
    keys: KeyParts  # the body/head split of model.personal_layers, and the BatchNorm keys
    parameters: int  # trainable parameters of the whole model
    state_bytes: int  # the whole state dict (buffers included), as stored
    client: str  # the client module: model.client, or the built-in FedClient around model.name
    optimizers: tuple[str, ...]  # its optimizers' param groups with the parts they train (``--dry-run`` prints them)
    own_optimizers: bool  # from the module's configure_optimizers (else fedsim's, from train.body / train.head)
    buffers: frozenset[str] = frozenset()  # state-dict keys that are statistics, not parameters (BatchNorm's)
    unpackable: str | None = None  # why the client module cannot be trained packed (engine.pack), or None


@dataclass(frozen=True, eq=False)
class RunPlan:
    cfg: RunConfig
    algorithm: Algorithm
    model: ModelPlan
    clients: tuple[ClientData, ...]
    num_classes: int
    input_shape: tuple[int, int, int]
    system: SystemModel | None = None  # devices and availability (system.devices set): the virtual clock's inputs
    unseen: frozenset[int] = frozenset()  # eval.unseen: the clients held out of training (scored only)
    code: tuple[tuple[str, str, str], ...] = ()  # (module, file, source digest) of fedsim and the driver's plug-ins

    # -- clients ---------------------------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @cached_property
    def train_sizes(self) -> list[int]:
        return [len(c.train) for c in self.clients]

    @cached_property
    def test_sizes(self) -> list[int]:
        return [len(c.test) for c in self.clients]

    @cached_property
    def train_steps(self) -> list[int]:
        return [steps_per_epoch(n, self.cfg.train.batch_size) for n in self.train_sizes]

    @cached_property
    def packing(self) -> tuple[int | str, str | None]:
        """(clients a worker trains at once, 1 = one after another, or "auto"; the one-line notice when
        engine.pack asks for packing that this method or module cannot have)."""
        wanted = self.cfg.engine.pack
        if wanted == 1:
            return 1, None
        why = self.model.unpackable if self.algorithm.packs() else (
            f"{self.algorithm.name}'s client hook does not declare packable = True (docs/packed.md)")
        if why:
            return 1, f"engine.pack: {wanted} not used, clients train one after another: {why}"
        return wanted, None

    @property
    def reported_accuracy(self) -> str:
        """The accuracy this run's protocol reports (its one-line summary's): the personalized one where the method's
        protocol fine-tunes (``Algorithm.reports``) or eval.personalize is own_update (the method's own update at
        evaluation is then the protocol), provided the run measures it (eval.personalizes); else the initial one."""
        wanted = "acc_personalized" if self.cfg.eval.personalize == "own_update" else self.algorithm.reports
        return wanted if self.cfg.eval.personalizes else "acc"

    @property
    def sees_replies(self) -> bool:
        """Whether the server receives every kept client's uploads (a method that aggregates replies itself, or a
        robust rule in place of the mean) instead of exact sums from the workers."""
        return self.algorithm.aggregation == "replies" or self.cfg.server.aggregator != "mean"

    @property
    def fewest_replies(self) -> int:
        """The fewest kept replies a round's aggregation is defined for (Krum: 2f + 3)."""
        return fewest_replies(self.cfg.server.aggregator, self.cfg.server.byzantine)

    @property
    def workers(self) -> int:
        return worker_count(self.cfg)

    @property
    def fixed_owners(self) -> bool:
        """Where clients keep state, each lives on one worker for the whole run; else any worker can train any
        client, and each round's sample is balanced over the workers afresh."""
        return self.algorithm.keeps_client_state

    @cached_property
    def assignments(self) -> list[dict[int, ClientData]]:
        """Each worker's clients. Where clients keep state, ownership is fixed and balanced by SGD steps per
        epoch (the quickstart's k=4 partition: 49 vs 56 batches per worker under client % workers, 54 vs 51
        here). Where they keep none, every worker gets every client's data (index arrays only)."""
        data = dict(enumerate(self.clients))
        if not self.fixed_owners:
            return [data] * self.workers
        owners = balanced_owners(self.train_steps, self.workers)
        return [{c: d for c, d in data.items() if owners[c] == w} for w in range(self.workers)]

    def initial_server_state(self) -> dict[str, np.ndarray]:
        """The method's round-0 server state (``Algorithm.server_state``), derived from the seed: the one place it
        is built. The server starts from it (and a rollback to round 0 builds it again, identically); the virtual
        clock sizes the round-0 broadcast by it. Not kept: for a method with per-client models on the server
        (FedAMP, FedFOMO) it is a clients x model table that the server replaces every round, and a kept round-0
        copy would double the server's memory for the whole run."""
        return self.algorithm.server_state(self.model.initial["shared"], self.num_clients, self.cfg.seed)

    @cached_property
    def traffic_per_client(self) -> tuple[int, int]:
        """(bytes down, bytes up) of one client in one round, as the server and workers account them: what the
        round-0 server sends its first client (a method that sends groups sends each client its own, of the same
        size), and a float32 vector of the shared size per upload (a method that folds replies itself may upload
        other sizes: the run's comm.jsonl has what it sent)."""
        [(_, first), *_] = self.algorithm.broadcast_groups(self.initial_server_state(), [0], True)
        return arrays_bytes(first), sum(payload_bytes(self.model.layouts["shared"].size) for _ in self.algorithm.uploads)

    # -- the schedule ----------------------------------------------------------------------------
    @cached_property
    def training_pool(self) -> np.ndarray | None:
        """The clients that may train, when some are held out (None: all of them)."""
        return np.array([c for c in range(self.num_clients) if c not in self.unseen]) if self.unseen else None

    def sampled(self, round_idx: int) -> list[int]:
        """The clients that train in ``round_idx``: f x N drawn from (seed, round) (train.sampling: poisson, each
        with probability f), or on the virtual clock those that report before the round closes."""
        if self.clock is not None:
            return list(self.clock.round(round_idx).participants)
        draw = poisson_clients if self.cfg.train.sampling == "poisson" else sample_clients
        return draw(self.cfg.seed, round_idx, self.num_clients, self.cfg.train.fraction, self.training_pool)

    # -- privacy: fedsim.plan.privacy, imported only with DP on (dp-accounting: ~0.6 s), never by the server ------
    @cached_property
    def user_level_dp(self) -> UserLevelDP | None:
        """The run's DP mechanism (None without DP): the server's noise and adaptive clip norm, each client's
        clipping."""
        t, clients = self.cfg.train, self.cfg.data.num_clients  # the config's count: a worker's plan holds no clients
        trainable = clients - self.cfg.eval.held_out(clients)
        poisson = t.sampling == "poisson"
        cohort = t.fraction * trainable if poisson else cohort_size(t.fraction, trainable)
        z = self.noise_multiplier
        return None if z is None else user_level_dp(self.cfg.privacy, z, self.cfg.seed, cohort, poisson)

    @property
    def private(self) -> bool:
        """Whether the run has DP to account for (privacy.dp central or local)."""
        return self.cfg.privacy is not None and self.cfg.privacy.dp != "none"

    @property
    def accounting(self) -> Accounting | None:
        """The accountant's view of the run, else None; not kept, so the server's copy unpickles without it."""
        if not self.private:
            return None
        from fedsim.plan.privacy import run_accounting

        population = self.num_clients - len(self.unseen)
        return run_accounting(self.cfg, population, cohort_size(self.cfg.train.fraction, population))

    @cached_property
    def noise_multiplier(self) -> float | None:
        """z (noise std / clip norm), the one place the mechanisms read it: privacy.noise_multiplier, or calibrated to
        privacy.target_epsilon at train.rounds before the run; None without DP."""
        accounting = self.accounting
        if accounting is None:
            return None
        from fedsim.plan.privacy import noise_multiplier

        return noise_multiplier(self.cfg, accounting, self.sampled, self.num_clients)

    @cached_property
    def privacy_spent(self) -> tuple[dict[str, float], ...]:
        """Per round, the epsilon spent by its end (``fedsim.privacy.SPENT``'s keys); empty without DP."""
        accounting, z = self.accounting, self.noise_multiplier
        if accounting is None or z is None:
            return ()
        from fedsim.plan.privacy import spent_per_round

        pool = [c for c in range(self.num_clients) if c not in self.unseen]
        return spent_per_round(self.cfg, accounting, z, self.sampled, self.num_clients, pool)

    def privacy_at(self, round_idx: int) -> dict[str, float]:
        """What rounds.jsonl records of round ``round_idx``'s privacy: a look-up in :attr:`privacy_spent`."""
        return self.privacy_spent[round_idx - 1] if self.privacy_spent else {}

    @property
    def privacy_summary(self) -> dict[str, object] | None:
        """summary.json's ``privacy`` and ``--dry-run``'s line: final epsilon, delta, z, accountant, sampling."""
        accounting, z = self.accounting, self.noise_multiplier
        if accounting is None or z is None:
            return None
        from fedsim.plan.privacy import privacy_summary

        return privacy_summary(self.cfg, accounting, z, self.privacy_spent)

    def refuse_over_budget(self) -> None:
        """Refuse a run that would pass privacy.target_epsilon; on the driver, computing z and the series once."""
        if self.private:
            from fedsim.plan.privacy import refuse_over_budget

            refuse_over_budget(self.cfg, self.privacy_spent)

    def pairwise_masks(self, round_idx: int) -> PairwiseMasks | None:
        """privacy.secure_aggregation: the round's masks over its cohort, the clients sent the model: on the virtual
        clock also those that drop out or report late (the server removes their masks, as the protocol's recovery
        does), in an asynchronous step the reports it takes. None without secure aggregation."""
        if self.cfg.privacy is None or not self.cfg.privacy.secure_aggregation:
            return None
        timing = self.timing(round_idx)
        cohort = timing.selected if timing is not None and not timing.versions else self.sampled(round_idx)
        return PairwiseMasks(self.cfg.seed, round_idx, tuple(sorted(cohort)))

    @cached_property
    def clock(self) -> Clock | None:
        """The virtual clock (system.devices set), else None: rounds take no simulated time."""
        if self.system is None:
            return None
        epochs = self.algorithm.epochs_per_round(self.cfg.train.local_epochs)
        down, up = self.traffic_per_client
        trainable = np.ones(self.num_clients, bool)
        trainable[list(self.unseen)] = False
        timing = (self.system, self.cfg.seed, self.cfg.train.fraction, np.array(self.train_sizes, float) * epochs,
                  down, up, trainable)
        system = self.cfg.system
        if system.mode == "sync":
            return Clock(*timing)
        cohort = max(1, round(self.cfg.train.fraction * int(trainable.sum())))
        return AsyncClock(*timing, concurrency=system.concurrency or cohort, buffer=system.async_buffer)

    def timing(self, round_idx: int) -> RoundTime | None:
        return None if self.clock is None else self.clock.round(round_idx)

    def evaluates(self, round_idx: int) -> bool:
        """Every train.eval_every rounds, and always the final one."""
        return round_idx % self.cfg.train.eval_every == 0 or round_idx == self.cfg.train.rounds

    @cached_property
    def cohort(self) -> list[int]:
        return evaluation_cohort(self.cfg.seed, self.num_clients, self.cfg.eval.clients)

    def scored(self, round_idx: int) -> list[int]:
        """The clients an evaluation round scores: the cohort, except at the final round (and every
        eval.full_every rounds): every client."""
        every = self.cfg.eval.full_every
        if round_idx == self.cfg.train.rounds or (every and round_idx % every == 0):
            return list(range(self.num_clients))
        return self.cohort

    @cached_property
    def partition_digest(self) -> str:
        """Which clients hold which samples (and label maps): recorded in every checkpoint, so a resume over an
        edited partition.npz (a client dropped, two swapped) is refused instead of training other data."""
        h = hashlib.sha256(str(len(self.clients)).encode())
        for c in self.clients:
            for part in (c.train, c.test, c.label_map):
                h.update(b"-" if part is None else np.ascontiguousarray(part, np.int64).tobytes() + b"|")
        return h.hexdigest()[:16]

    def for_workers(self) -> RunPlan:
        """The plan a worker receives: without the clients' data, which each worker gets beside it for its own
        clients only (every client's indices on every worker would cost each one memory in the population:
        measured 5.6 KB per registered client at N = 10,000, 2.4 KB without)."""
        plan = dataclasses.replace(self, clients=(), system=None)  # the server alone keeps the clock
        if self.private:  # calibrated here, once: a plan without its clients could not
            plan.__dict__["noise_multiplier"] = self.noise_multiplier
        return plan

    @cached_property
    def fingerprint(self) -> str:
        """What a checkpoint must match to continue this run (with the devices and availability a trace gave)."""
        computed = self.cfg.model_dump()
        computed["engine"]["pack"] = self.packing[0]  # a run that cannot pack trains as an unpacked one does
        settings = resume_fingerprint(computed)
        if self.system is None:
            return settings
        return hashlib.sha256(f"{settings}|{self.system.digest}".encode()).hexdigest()[:16]
