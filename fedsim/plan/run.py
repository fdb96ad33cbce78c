"""A run's plan: everything derivable from its config, data and partition, built once on the driver
(:func:`fedsim.plan.build.build_plan`) and handed to the server and ``--dry-run``'s estimate; the workers get
their part of it (:class:`WorkerPlan`).

It holds the method, the model's layouts and round-0 values, each client's data, the lr schedule, the
clients sampled each round, the evaluation rounds and cohort, and which worker owns which client. Every
schedule here is a pure function of the seed and the config, never of the number of workers, which is why
results do not depend on how a run is spread.

This module imports no torch: the server's process receives the plan too."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedsim.algorithms.base import Algorithm
from fedsim.config import RunConfig, resume_fingerprint
from fedsim.core.protocol import ClientData, arrays_bytes, payload_bytes
from fedsim.core.robust import fewest_replies
from fedsim.plan.assignment import balanced_owners, steps_per_epoch, worker_count
from fedsim.plan.async_clock import AsyncClock
from fedsim.plan.model import ModelPlan
from fedsim.plan.population import Population, evaluation_cohort
from fedsim.plan.system import Clock, RoundTime, SystemModel
from fedsim.privacy.mechanism import PrivacyPlan, UserLevelDP
from fedsim.privacy.secagg import PairwiseMasks


@dataclass(frozen=True, eq=False)
class WorkerPlan:
    """What a worker reads of the run's plan (``RunPlan.for_workers``): no client's data, which each worker gets
    beside it for its own clients only, and neither the schedule nor the clock, which are the server's."""
    cfg: RunConfig
    algorithm: Algorithm
    model: ModelPlan
    num_classes: int
    input_shape: tuple[int, int, int]
    code: tuple[tuple[str, str, str], ...]  # (module, file, source digest) of fedsim and the driver's plug-ins
    packing: tuple[int | str, str | None]  # RunPlan.packing
    user_level_dp: UserLevelDP | None  # each client's clipping (RunPlan.privacy's mechanism)


@dataclass(frozen=True, eq=False)
class RunPlan:
    """The run's plan as the driver, the server and the estimate read it. It runs past 200 lines because every
    derived value they read lives here, once (privacy's in one value, :class:`PrivacyPlan`; the masks' cohort), rather
    than recomputed where it is read."""
    cfg: RunConfig
    algorithm: Algorithm
    model: ModelPlan
    clients: tuple[ClientData, ...]
    num_classes: int
    input_shape: tuple[int, int, int]
    population: Population  # who may train and how many a round: what sampling, DP and the clock read
    system: SystemModel | None = None  # devices and availability (system.devices set): the virtual clock's inputs
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
    def sampled(self, round_idx: int) -> list[int]:
        """The clients that train in ``round_idx``: f x N drawn from (seed, round) (train.sampling: poisson, each
        with probability f), or on the virtual clock those that report before the round closes."""
        if self.clock is not None:
            return list(self.clock.round(round_idx).participants)
        return self.population.sampled(self.cfg.seed, round_idx)

    # -- privacy: fedsim.plan.privacy, imported only with DP on (dp-accounting: ~0.6 s), never by the server ------
    @property
    def private(self) -> bool:
        """Whether the run has DP to account for (privacy.dp central or local)."""
        return self.cfg.privacy is not None and self.cfg.privacy.dp != "none"

    @cached_property
    def privacy(self) -> PrivacyPlan | None:
        """The run's DP, derived once on the driver (None without DP): z given or calibrated, the mechanism, the epsilon
        spent by each round's end, the summary; a run that would pass privacy.target_epsilon is refused here."""
        if not self.private:
            return None
        from fedsim.plan.privacy import derive_privacy

        return derive_privacy(self.cfg, self.population, self.sampled, self.num_clients)

    def privacy_at(self, round_idx: int) -> dict[str, float]:
        """What rounds.jsonl records of round ``round_idx``'s privacy (empty without DP)."""
        return {} if self.privacy is None else self.privacy.spent[round_idx - 1]

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
        timing = (self.system, self.cfg.seed, self.population, np.array(self.train_sizes, float) * epochs, down, up)
        system = self.cfg.system
        if system.mode == "sync":
            return Clock(*timing)
        return AsyncClock(*timing, concurrency=system.concurrency or self.population.cohort, buffer=system.async_buffer)

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

    def for_workers(self) -> WorkerPlan:
        """The plan a worker receives: without the clients' data, which each worker gets beside it for its own
        clients only (every client's indices on every worker would cost each one memory in the population:
        measured 5.6 KB per registered client at N = 10,000, 2.4 KB without); DP's mechanism calibrated here, once."""
        return WorkerPlan(self.cfg, self.algorithm, self.model, self.num_classes, self.input_shape, self.code,
                          self.packing, None if self.privacy is None else self.privacy.mechanism)

    @cached_property
    def fingerprint(self) -> str:
        """What a checkpoint must match to continue this run (with the devices and availability a trace gave)."""
        computed = self.cfg.model_dump()
        computed["engine"]["pack"] = self.packing[0]  # a run that cannot pack trains as an unpacked one does
        settings = resume_fingerprint(computed)
        if self.system is None:
            return settings
        return hashlib.sha256(f"{settings}|{self.system.digest}".encode()).hexdigest()[:16]
