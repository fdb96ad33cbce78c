"""The server: owns the global state, samples clients, dispatches them to workers (each client's owner
where clients keep state), and turns their uploads into the next global state through the
algorithm's server hook. Runs as a Ray actor so a submitted job's entrypoint only loops over rounds
and writes results. (In Ray's words the *driver* is the process that calls ``ray.init``: the
entrypoint.)

This module imports no torch: the server's process is up in well under a second while the workers
(started by the entrypoint at the same time) spend ~3 s importing torch and Lightning.

A round reads in one place, in numbered steps (``Server._round``). How the uploads are reduced (exact sums,
FedBuff's buffered sums, or collected replies) is chosen once, in ``__init__`` (``reduction``); what the server holds
between rounds and its checkpoints is ``server_state``'s. The workers' health, timeouts and replacement are the pool's
(``pool.WorkerPool``); FedBuff's asynchronous step is ``fedbuff``'s; DP's noise and clip norm
``fedsim.privacy.mechanism.ServerPrivacy``'s, secure aggregation's recovery ``fedsim.privacy.secagg``'s."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from fedsim import storage
from fedsim.core import checkpoint
from fedsim.core.pages import release_shared
from fedsim.core.protocol import (WEIGHTS, ClientRecord, ClientReport, CommRecord, RolledBack, RoundFailed,
                                  RoundOutcome, RoundResult, add_columns, arrays_bytes)
from fedsim.engine.fedbuff import FedBuff
from fedsim.engine.pool import Bundle, Calls, Handle, Ref, Spawn, WorkerPool
from fedsim.engine.reduction import reduction_for
from fedsim.engine.server_state import ServerState
from fedsim.plan import RunPlan, balanced_owners
from fedsim.plan.system import RoundTime
from fedsim.privacy.mechanism import ServerPrivacy


class Server:
    """``workers[i]`` hosts ``plan.assignments[i]``; the entrypoint spawns them so they start while this actor
    does, and the pool's ``spawn`` replaces one that is lost (in its bundle, with the same clients)."""

    def __init__(self, plan: RunPlan, workers: list[Handle], spawn: Spawn, bundles: list[Bundle] | None, calls: Calls):
        self.plan = plan
        self.calls = calls
        self.cfg = plan.cfg
        self.algorithm = plan.algorithm
        self.pool = WorkerPool(workers, plan.assignments, spawn, bundles, plan.cfg.engine, calls)
        self.owner = {c: w for w, clients in enumerate(plan.assignments) for c in clients} if plan.fixed_owners else {}
        shared = plan.model.layouts["shared"]
        statistics = np.zeros(shared.offsets[-1], bool)  # where the shared vector holds buffers
        for key, _, start, end in shared.spans():
            statistics[start:end] = key in plan.model.buffers
        fedbuff = FedBuff(self.cfg.system.server_lr, statistics, self.cfg.system.server_momentum)
        self.held = ServerState(plan, fedbuff, ServerPrivacy(None if plan.privacy is None else plan.privacy.mechanism))
        self.reduction = reduction_for(plan, self.held)
        self.broadcast_ref = self._publish()
        self.bytes_down = arrays_bytes({name: self.state[name] for name in self.algorithm.broadcast})
        self.received: dict[int, int] = {}  # client -> bytes of the broadcast it received this round

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The method's server state (the global weights among it)."""
        return self.held.values

    def _publish(self) -> Ref | None:
        """One object in Ray's store per round holding what every client receives; none for a method that sends
        each group its own (``_messages`` puts those), which would leave a model-sized object unread in the store."""
        if self.algorithm.broadcasts_by_group():
            return None
        return self._put({name: self.state[name] for name in self.algorithm.broadcast})

    def _messages(self, clients: list[int], training: bool) -> list[tuple[list[int], Any, int]]:
        """(clients, the broadcast they receive in Ray's store, its size in bytes) per group: the round's one
        broadcast, or for a method that sends groups (``Algorithm.broadcast_groups``) one object per group."""
        if not self.algorithm.broadcasts_by_group():
            return [(clients, self.broadcast_ref, self.bytes_down)]
        groups = self.algorithm.broadcast_groups(self.state, clients, training)
        return [(members, self._put(vectors), arrays_bytes(vectors)) for members, vectors in groups if members]

    def _put(self, vectors: dict[str, np.ndarray]) -> Ref:
        """``ray.put``, without keeping the copy: writing the object mapped its pages into this process, a
        second model-sized copy in its memory until released (the store keeps the data)."""
        ref = self.calls.put(vectors)
        for view in self.calls.get(ref).values():
            release_shared(view)
        return ref

    def worker_info(self) -> list[dict[str, Any]]:
        return self.pool.get([w.device_info.remote() for w in self.pool.workers])

    def global_weights(self) -> np.ndarray:
        return self.state[WEIGHTS]

    def _by_worker(self, clients: list[int], costs: list[int]) -> dict[int, list[int]]:
        """Worker -> its share of ``clients``: the owners where clients keep state, else a fresh
        cost-balanced split (which worker trains a client never changes its result)."""
        if self.plan.fixed_owners:
            owners = [self.owner[c] for c in clients]
        else:
            owners = balanced_owners([costs[c] for c in clients], len(self.pool))
        groups: dict[int, list[int]] = {}
        for c, w in zip(clients, owners):
            groups.setdefault(w, []).append(c)
        return groups

    # -- one round -------------------------------------------------------------------------------
    def round(self, round_idx: int) -> RoundOutcome:
        """Train the sampled clients, aggregate, and (on evaluation rounds) score every client.
        A worker lost mid-round is replaced and the run rolls back to the last checkpoint."""
        try:
            outcome = self._round(round_idx)
        except RayActorError:
            return RolledBack(round_idx, self._recover())
        self.pool.round_completed()
        return outcome

    def _round(self, round_idx: int) -> RoundOutcome:
        started = time.perf_counter(), time.process_time()
        # 1. configure: who trains (on the virtual clock possibly nobody: all dropped or late), and what they are sent
        timing = self.plan.timing(round_idx)
        sampled = self.plan.sampled(round_idx)
        self.reduction.configure(round_idx, sampled, timing)
        # 2. dispatch and collect
        reports = self._dispatch_and_collect(round_idx, sampled, timing)
        # 3. check
        diverged = [r for r in reports if r.diverged]
        kept = [r for r in reports if not r.diverged]
        failure = self._failure(round_idx, diverged) or self.reduction.failure(round_idx, kept)
        if failure:
            return RoundFailed(round_idx, failure)
        # 4. update
        self._update(round_idx, kept, timing)
        self.held.times_sampled[sampled] += 1
        # 5. evaluate
        records = self._evaluate(round_idx, {r.client: r for r in kept}) if self.plan.evaluates(round_idx) else []
        # 6. record
        return self._result(round_idx, sampled, diverged, kept, records, timing, started)

    def _dispatch_and_collect(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> list[ClientReport]:
        """Every sampled client's report, in client order (so logs and the client an error names do not depend on how
        work was split); the reduction takes in each worker's answer as it comes."""
        reports: list[ClientReport] = []
        for _, partial in self.pool.as_completed(self._training_calls(round_idx, sampled, timing)):
            reports += self.reduction.add(partial)
        self.reduction.close(reports)
        return sorted(reports, key=lambda r: r.client)

    def _training_calls(self, round_idx: int, sampled: list[int], timing: RoundTime | None) -> list[Ref]:
        """One call per worker and model: a synchronous round sends every client the current model; an
        asynchronous step each client the model it was dispatched with."""
        calls, self.received = [], {}
        for clients, older in self.reduction.models(round_idx, sampled, timing):
            messages = (self._messages(clients, True) if older is None
                        else [(clients, self._put({WEIGHTS: older}), self.bytes_down)])
            for members, ref, size in messages:
                self.received |= dict.fromkeys(members, size)
                for w, cs in self._by_worker(members, self.plan.train_steps).items():
                    calls.append(self.reduction.call(self.pool.workers[w], ref, cs, round_idx))
        return calls

    def _failure(self, round_idx: int, diverged: list[ClientReport]) -> str | None:
        """A diverged client under train.on_nonfinite=stop ends the run."""
        if not diverged or self.cfg.train.on_nonfinite != "stop":
            return None
        first = diverged[0]
        what = ("its update left the fixed-point range (over 2^16 x the global's largest value)"
                if first.out_of_range else "training loss is not finite")
        return (f"client {first.client}, round {round_idx}: {what}; lower train.body.lr / train.head.lr, or set "
                "train.on_nonfinite=drop to skip such updates")

    def _update(self, round_idx: int, kept: list[ClientReport], timing: RoundTime | None) -> None:
        """The next server state, published for the next round's clients if it changed."""
        previous = self.state[WEIGHTS]  # an asynchronous step's: the model clients still in flight started from
        if kept:
            changed = self.reduction.update(round_idx, kept, timing)
        else:
            changed = bool(self.reduction.shared_size) and self.held.privacy.releases_empty_rounds
            if changed:
                self.reduction.release_noise_alone(round_idx)
        if changed:
            self.broadcast_ref = self._publish()
        self.reduction.after_update(previous, timing)

    def _evaluate(self, round_idx: int, trained: dict[int, ClientReport]) -> list[ClientRecord]:
        """Every scored client's record; one trained this round also carries its training loss and what its
        module logged while training (``self.log``)."""
        calls = [self.pool.workers[w].evaluate.remote(ref, cs, round_idx)
                 for members, ref, _ in self._messages(self.plan.scored(round_idx), False)
                 for w, cs in self._by_worker(members, self.plan.test_sizes).items()]
        records: list[ClientRecord] = sorted((r for batch in self.pool.get_watching(calls) for r in batch),
                                             key=lambda r: r["client"])
        for r in records:
            report = trained.get(r["client"])
            r["round"] = round_idx
            r["train_loss"] = report.train_loss if report else None
            r["times_sampled"] = int(self.held.times_sampled[r["client"]])  # 0: scored with its round-0 personal part
            if r["client"] in self.plan.population.unseen:
                r["unseen"] = True  # held out of training by eval.unseen
            add_columns(r, report.logged if report else {})
        return records

    def _result(self, round_idx: int, sampled: list[int], diverged: list[ClientReport], kept: list[ClientReport],
                records: list[ClientRecord], timing: RoundTime | None, started: tuple[float, float]) -> RoundResult:
        """What the round did, for the driver's callbacks: its clients, records, traffic, time and mechanisms."""
        mechanism = self.algorithm.mechanism(self.state) if kept else {}
        privacy = self.held.privacy.after_round(round_idx, [r.update_norm for r in kept if r.update_norm is not None])
        comm: list[CommRecord] = [{"round": round_idx, "client": r.client, "bytes_down": self.received[r.client],
                                   "bytes_up": r.bytes_up} for r in kept]
        wall, cpu = started
        cpu = time.process_time() - cpu + self.pool.cpu_seconds_since_last()
        return RoundResult(round_idx, sampled, [r.client for r in diverged], records, comm, time.perf_counter() - wall,
                           cpu, timing=timing.row() if timing else {}, mechanism=mechanism, privacy=privacy,
                           spent=self.plan.privacy_at(round_idx))

    # -- checkpoints and recovery ----------------------------------------------------------------
    def checkpoint(self, run_location: str, round_idx: int) -> str | RolledBack:
        """Each worker writes its own file straight to the run's storage; then the driver publishes. A worker
        lost while writing its part rolls back like a worker lost mid-round (the rounds since the previous
        checkpoint are redone)."""
        staging = checkpoint.begin(run_location, round_idx)
        names = [f"worker-{i}.npz" for i in range(len(self.pool))]
        bases = self.held.next_bases()
        try:
            digests = self.pool.get_watching([w.save_state.remote(storage.join(staging, name), not bases)
                                              for w, name in zip(self.pool.workers, names)])
        except RayActorError:
            return RolledBack(round_idx, self._recover())
        return self.held.save(staging, round_idx, bases, dict(zip(names, digests)), self.pool.recoveries)

    def restore(self, ckpt: str | None) -> int:
        """Load the global state and every worker's clients from ``ckpt`` (None: round 0). Returns its round.
        A worker lost meanwhile (also one dying while it starts) is replaced, bounded like any other loss."""
        try:
            round_idx = self.held.load(ckpt)
            self.pool.get_from_each([w.load_state.remote(ckpt) for w in self.pool.workers])
        except RayActorError:
            return self._recover()
        self.broadcast_ref = self._publish()
        return round_idx

    def _recover(self) -> int:
        """Replace lost workers and roll everyone back to the last checkpoint: every client's work since
        then is redone from the same inputs, so the results equal those of a fault-free run."""
        self.pool.replace_lost()
        return self.restore(self.held.last_checkpoint)

    def shutdown(self) -> None:
        self.pool.shutdown()


ServerActor = ray.remote(Server)
