"""The server: owns the global state, samples clients, dispatches them to workers (each client's owner
where clients keep state), and turns their uploads into the next global state through the
algorithm's server hook. Runs as a Ray actor so a submitted job's entrypoint only loops over rounds
and writes results. (In Ray's words the *driver* is the process that calls ``ray.init``: the
entrypoint.)

This module imports no torch: the server's process is up in well under a second while the workers
(started by the entrypoint at the same time) spend ~3 s importing torch and Lightning."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from fedsim import storage
from fedsim.core import checkpoint
from fedsim.core.aggregate import FixedPoint, RoundSums
from fedsim.core.pages import release_shared
from fedsim.core.protocol import (WEIGHTS, ClientData, ClientReport, Reply, RolledBack, RoundFailed, RoundOutcome,
                                  RoundResult, SumPlan, arrays_bytes)
from fedsim.core.robust import robust_means
from fedsim.plan import RunPlan, balanced_owners
from fedsim.plan.system import RoundTime

PING_TIMEOUT_S = 60
MODEL_PREFIX = "model_at_step_"  # checkpointed server state: an older global model asynchronous clients still hold

Spawn = Callable[[dict[int, ClientData], Any], Any]
"""``spawn(clients, bundle)``: a new worker actor hosting ``clients``, scheduled by ``bundle``."""


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class WorkerLost(RuntimeError):
    """A worker kept dying (or freezing) however often it was replaced: one line naming it and its clients."""


class Server:
    """``workers[i]`` hosts ``plan.assignments[i]``; the entrypoint spawns them so they start while this actor
    does, and ``spawn`` replaces one that is lost (in its bundle, with the same clients)."""

    def __init__(self, plan: RunPlan, workers: list, spawn: Spawn, bundles: list | None = None):
        self.plan = plan
        self.cfg = plan.cfg
        self.algorithm = plan.algorithm
        self.spawn = spawn
        self.assignments = plan.assignments  # kept to respawn a lost worker with the same clients, in the same bundle
        self.bundles = bundles or ["SPREAD"] * len(workers)
        self.owner = {c: w for w, clients in enumerate(self.assignments) for c in clients} if plan.fixed_owners else {}
        self.num_clients = plan.num_clients
        self.workers = list(workers)
        self.initial_global = plan.model.initial["shared"]
        # Tensor boundaries in the shared vector: fixed-point scales are per tensor.
        self.tensor_offsets = plan.model.layouts["shared"].offsets
        self.statistics = np.zeros(self.tensor_offsets[-1], bool)  # where the shared vector holds buffers
        for key, _, start, end in plan.model.layouts["shared"].spans():
            self.statistics[start:end] = key in plan.model.buffers
        self.state = self._initial_state()
        self.models: dict[int, np.ndarray] = {}  # asynchronous: older global weights clients still train from
        self.broadcast_ref = self._publish()
        self.bytes_down = arrays_bytes({name: self.state[name] for name in self.algorithm.broadcast})
        self.received: dict[int, int] = {}  # client -> bytes of the broadcast it received this round
        self.times_sampled = np.zeros(self.num_clients, np.int64)
        self.last_checkpoint: str | None = None
        self.last_chain: list[list[str]] = []  # the last checkpoint's bases and itself: what the next delta builds on
        self.recoveries = 0
        self.losses_in_a_row = 0  # recoveries since a round last completed: bounded by engine.max_recoveries
        self.unresponsive: set[int] = set()  # workers killed for not answering pings, named if the run gives up

    def _initial_state(self) -> dict[str, np.ndarray]:
        return self.algorithm.server_state(self.initial_global, self.num_clients, self.cfg.seed)

    def _publish(self):
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

    @staticmethod
    def _put(vectors: dict[str, np.ndarray]):
        """``ray.put``, without keeping the copy: writing the object mapped its pages into this process, a
        second model-sized copy in its memory until released (the store keeps the data)."""
        ref = ray.put(vectors)
        for view in ray.get(ref).values():
            release_shared(view)
        return ref

    @property
    def shared_size(self) -> int:
        return self.initial_global.size

    def _get(self, refs):
        return ray.get(refs, timeout=self.cfg.engine.round_timeout_s)

    def _get_from_each(self, refs: list) -> list:
        """``_get`` of one call per worker (``refs[i]`` on worker i), naming the silent workers on timeout.
        Not watched by pings: a worker still importing torch cannot answer them yet."""
        timeout = self.cfg.engine.round_timeout_s
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            silent = [i for i, ref in enumerate(refs) if ref in pending]
            raise GetTimeoutError(f"{self._name_worker(silent[0])} did not answer within engine.round_timeout_s="
                                  f"{timeout:g} (frozen, or out of memory)")
        return ray.get(refs)

    def _name_worker(self, index: int) -> str:
        clients = sorted(self.assignments[index])
        shown = ", ".join(map(str, clients[:8])) + (f" and {len(clients) - 8} more" if len(clients) > 8 else "")
        return f"worker {index} (clients {shown})"

    def _get_watching(self, refs: list) -> list:
        """Like ``_get`` for a round's calls, watched as ``_as_completed`` watches them; in the order of ``refs``."""
        results = [None] * len(refs)
        for index, result in self._as_completed(refs):
            results[index] = result
        return results

    def _as_completed(self, refs: list) -> Iterator[tuple[int, Any]]:
        """(index in ``refs``, result) of each call as soon as it is done, so a caller can use and drop one
        answer before the next. A worker that stops answering pings is killed after engine.heartbeat_timeout_s,
        so its call fails now (and the round is redone on a replacement) instead of after the whole
        round_timeout_s. Pings run in their own thread on the worker, so a busy worker still answers; a frozen
        one (SIGSTOP, a lost machine) does not."""
        heartbeat, timeout = self.cfg.engine.heartbeat_timeout_s, self.cfg.engine.round_timeout_s
        deadline, next_ping = time.monotonic() + timeout, time.monotonic() + heartbeat
        index = {id(ref): i for i, ref in enumerate(refs)}  # ray.wait hands back the very refs it was given
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(next_ping - time.monotonic(), 0))
            for ref in ready:
                yield index[id(ref)], ray.get(ref)
            if pending and time.monotonic() >= next_ping:
                self._kill_unresponsive()
                next_ping = time.monotonic() + heartbeat
                if time.monotonic() > deadline:
                    raise GetTimeoutError(f"no answer within engine.round_timeout_s={timeout:g}")

    def _kill_unresponsive(self) -> None:
        pings = {w.ping.remote(): index for index, w in enumerate(self.workers)}
        answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=self.cfg.engine.heartbeat_timeout_s)
        for ref, index in pings.items():
            if ref not in answered:
                self.unresponsive.add(index)
                ray.kill(self.workers[index])  # its pending call now fails with RayActorError: recovery follows

    def worker_info(self) -> list[dict]:
        return self._get([w.device_info.remote() for w in self.workers])

    def global_weights(self) -> np.ndarray:
        return self.state[WEIGHTS]

    def _by_worker(self, clients: list[int], costs: list[int]) -> dict[int, list[int]]:
        """Worker -> its share of ``clients``: the owners where clients keep state, else a fresh
        cost-balanced split (which worker trains a client never changes its result)."""
        if self.plan.fixed_owners:
            owners = [self.owner[c] for c in clients]
        else:
            owners = balanced_owners([costs[c] for c in clients], len(self.workers))
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
        self.losses_in_a_row = 0
        return outcome

    def _round(self, round_idx: int) -> RoundOutcome:
        start = time.perf_counter()
        timing = self.plan.timing(round_idx)
        sampled = self.plan.sampled(round_idx)  # on the virtual clock, possibly nobody (all dropped or late)
        replying = self.plan.sees_replies
        plan = self._sum_plan(sampled, timing) if sampled and not replying else None
        sums = RoundSums(plan.scales if plan else (), self.shared_size)
        reports: list[ClientReport] = []
        replies: list[Reply] = []
        for _, partial in self._as_completed(self._training_calls(sampled, round_idx, plan, timing)):
            if replying:
                replies += partial.replies
            else:
                sums.add(partial.sums, partial.weights)  # then dropped: W partials are never held at once
            reports += partial.reports
        # In client order, so logs and the client an error names do not depend on how work was split.
        reports.sort(key=lambda r: r.client)
        diverged = [r for r in reports if r.diverged]
        if diverged and self.cfg.train.on_nonfinite == "stop":
            first = diverged[0]
            what = ("its update left the fixed-point range (over 2^16 x the global's largest value)"
                    if first.out_of_range else "training loss is not finite")
            return RoundFailed(round_idx, f"client {first.client}, round {round_idx}: {what}; lower train.body.lr / "
                               "train.head.lr, or set train.on_nonfinite=drop to skip such updates")
        kept = [r for r in reports if not r.diverged]
        fewest = self.plan.fewest_replies
        if replying and kept and len(kept) < fewest:
            s = self.cfg.server
            return RoundFailed(round_idx, f"server.aggregator: {s.aggregator} with server.byzantine={s.byzantine} needs "
                               f"{fewest} replies a round, round {round_idx} kept {len(kept)}; lower server.byzantine "
                               "or sample more clients (train.fraction)")
        asynchronous = timing is not None and bool(timing.versions)
        previous = self.state[WEIGHTS] if asynchronous else None  # a model clients still in flight started from
        if replying and kept:
            self._fold_replies(sorted(replies, key=lambda r: r.client))
            del replies  # a model size per client
            self.broadcast_ref = self._publish()
        elif self.shared_size and kept:
            self._aggregate(plan, sums, kept, timing)
            del sums  # two model sizes of int64, not to be held while the new state is published and evaluated
            self.broadcast_ref = self._publish()
        if asynchronous:
            self._keep_models(previous, timing)
        self.times_sampled[sampled] += 1
        records = self._evaluate(round_idx, {r.client: r for r in kept}) if self.plan.evaluates(round_idx) else []
        comm = [{"round": round_idx, "client": r.client, "bytes_down": self.received[r.client], "bytes_up": r.bytes_up}
                for r in kept]
        return RoundResult(round_idx, sampled, [r.client for r in diverged], records, comm, time.perf_counter() - start,
                           timing=timing.row() if timing else {})

    def _training_calls(self, sampled: list[int], round_idx: int, plan: SumPlan | None, timing: RoundTime | None) -> list:
        """One call per worker and model: a synchronous round sends every client the current model; an
        asynchronous step each client the model it was dispatched with (kept in ``self.models`` since)."""
        current = round_idx - 1
        by_model = {current: sampled}
        if timing is not None and timing.versions:
            by_model = {}
            for client, version in zip(timing.participants, timing.versions):
                by_model.setdefault(version, []).append(client)
        calls, self.received = [], {}
        for version, clients in sorted(by_model.items()):
            older = {WEIGHTS: self.models[version]} if version != current else None
            messages = self._messages(clients, True) if older is None else [(clients, self._put(older), self.bytes_down)]
            for members, ref, size in messages:
                self.received |= dict.fromkeys(members, size)
                for w, cs in self._by_worker(members, self.plan.train_steps).items():
                    worker = self.workers[w]
                    calls.append(worker.train_and_reply.remote(ref, cs, round_idx) if self.plan.sees_replies
                                 else worker.train_and_sum.remote(ref, cs, round_idx, plan))
        return calls

    def _sum_plan(self, sampled: list[int], timing: RoundTime | None) -> SumPlan:
        """Per upload, the fixed-point scale for this round's exact sums: from the server's current value of
        that upload (the global weights for ``weights``) and the sampled clients' total weight; in an
        asynchronous step, each client's staleness factor (1 + s)^-system.staleness_exponent."""
        scales, uniform = {}, {}
        for name, weighting in self.algorithm.uploads.items():
            uniform[name] = (weighting or self.cfg.train.weighting) == "uniform"
            total = len(sampled) if uniform[name] else sum(self.plan.train_sizes[c] for c in sampled)
            scales[name] = FixedPoint.plan(self.state.get(name, self.state[WEIGHTS]), self.tensor_offsets, total)
        if timing is None or not timing.versions:
            return SumPlan(scales, uniform)
        exponent = self.cfg.system.staleness_exponent
        return SumPlan(scales, uniform, {c: (1 + s) ** -exponent for c, s in zip(timing.participants, timing.staleness())})

    def _aggregate(self, plan: SumPlan, sums: RoundSums, kept: list[ClientReport], timing: RoundTime | None) -> None:
        """Turn the exact sums into means and let the algorithm's server hook make the next global state of
        them, tensor by tensor where the hook allows (``Algorithm.server_by_tensor``): float64 means of one tensor
        at a time, never of the whole model. The caller publishes the new state."""
        buffered = self._buffered_terms(plan, kept, timing) if plan.factors else None
        new = {name: np.empty_like(vector) for name, vector in self.state.items()}
        tensors = range(len(self.tensor_offsets) - 1)
        for group in ([[t] for t in tensors] if self.algorithm.server_by_tensor() else [list(tensors)]):
            start, end = self.tensor_offsets[group[0]], self.tensor_offsets[group[-1] + 1]
            means = {name: _joined([scale.mean(sums.totals[name], sums.weights[name], t) for t in group])
                     for name, scale in plan.scales.items()}
            if buffered:
                means[WEIGHTS] = self._buffered_step(means[WEIGHTS], start, end, *buffered)
            state = {name: vector[start:end] for name, vector in self.state.items()}
            self.algorithm.server_update(state, means, len(kept), self.num_clients)
            for name, vector in new.items():
                vector[start:end] = state[name]
        for vector in self.state.values():
            release_shared(vector)  # the round-0 state is the plan's, in Ray's object store
        self.state = new

    def _fold_replies(self, replies: list[Reply]) -> None:
        """The new server state from the round's kept replies (in client order): the method's own hook, or a robust
        rule (server.aggregator) in place of the mean, handed to its server_update on whole vectors."""
        state = dict(self.state)
        if self.algorithm.aggregation == "replies":
            self.algorithm.server_replies(state, replies, self.num_clients)
        else:
            s = self.cfg.server
            uploads = {name: [r.uploads[name] for r in replies] for name in self.algorithm.uploads}
            means = robust_means(s.aggregator, s.trim_fraction, s.byzantine, s.krum_select, uploads, WEIGHTS)
            self.algorithm.server_update(state, means, len(replies), self.num_clients)
        for name, vector in self.state.items():
            if state.get(name) is not vector:
                release_shared(vector)  # the round-0 state is the plan's, in Ray's object store
        for reply in replies:
            for vector in reply.uploads.values():
                release_shared(vector)  # read through Ray's store: its pages would stay in this process's memory
        self.state = state

    def _buffered_terms(self, plan: SumPlan, kept: list[ClientReport],
                        timing: RoundTime) -> tuple[list[tuple[float, np.ndarray]], float]:
        """FedBuff's server step (Nguyen et al. 2022, Algorithm 1): x_r = x_(r-1) + server_lr x
        sum_j a_j s_j (x_j - x_(v_j)) / sum_j a_j, a_j = n_j (or 1), s_j the staleness factor. The workers summed
        sum_j a_j s_j x_j / sum_j a_j exactly; the models the clients started from are the server's own, so it
        subtracts their weighted mean itself. Here, per kept client in client order, its coefficient
        a_j s_j / sum_j a_j and the model it started from; and the rescaling sum_j a_j / sum_j a_j s_j of the
        statistics' mean (``_buffered_step``)."""
        version = dict(zip(timing.participants, timing.versions))
        weight = {r.client: 1 if plan.uniform[WEIGHTS] else r.n_train for r in kept}
        total = sum(weight.values())
        terms = [(weight[r.client] * plan.factors[r.client] / total, self._model(version[r.client], timing))
                 for r in kept]
        return terms, total / sum(weight[r.client] * plan.factors[r.client] for r in kept)

    def _buffered_step(self, mean: np.ndarray, start: int, end: int, terms: list[tuple[float, np.ndarray]],
                       rescale: float) -> np.ndarray:
        """FedBuff's step on one tensor of the weights (float64, clients in order: the same for any number of
        workers and any tensor split, since every operation is element by element)."""
        started_from = np.zeros(end - start, np.float64)
        for coefficient, model in terms:
            started_from += coefficient * model[start:end]
        stepped = self.state[WEIGHTS][start:end] + self.cfg.system.server_lr * (mean - started_from)
        # Statistics (BatchNorm's running means and variances) are not parameters to step: a difference of stale
        # variances can go negative (the first stragglers run scored NaN). They take the reports' staleness-
        # weighted mean, sum_j a_j s_j x_j / sum_j a_j s_j, a convex combination like FedAvg's.
        statistics = self.statistics[start:end]
        stepped[statistics] = mean[statistics] * rescale
        return stepped

    def _model(self, version: int, timing: RoundTime) -> np.ndarray:
        return self.state[WEIGHTS] if version == timing.round - 1 else self.models[version]

    def _keep_models(self, previous: np.ndarray, timing: RoundTime) -> None:
        """After an asynchronous step: keep the older models that clients still training hold, drop the rest."""
        held = {**self.models, timing.round - 1: previous}
        self.models = {v: held[v] for v in timing.live_versions}

    def _evaluate(self, round_idx: int, trained: dict[int, ClientReport]) -> list[dict]:
        """Every scored client's record; one trained this round also carries its training loss and what its
        module logged while training (``self.log``)."""
        calls = [self.workers[w].evaluate.remote(ref, cs, round_idx)
                 for members, ref, _ in self._messages(self.plan.scored(round_idx), False)
                 for w, cs in self._by_worker(members, self.plan.test_sizes).items()]
        records = sorted((r for batch in self._get_watching(calls) for r in batch), key=lambda r: r["client"])
        for r in records:
            report = trained.get(r["client"])
            r["round"] = round_idx
            r["train_loss"] = report.train_loss if report else None
            r["times_sampled"] = int(self.times_sampled[r["client"]])  # 0: scored with its round-0 personal part
            if r["client"] in self.plan.unseen:
                r["unseen"] = True  # held out of training by eval.unseen
            r.update(report.logged if report else {})
        return records

    # -- checkpoints and recovery ----------------------------------------------------------------
    def checkpoint(self, run_location: str, round_idx: int) -> str | RolledBack:
        """Each worker writes its own file straight to the run's storage; then the driver publishes. A worker
        lost while writing its part rolls back like a worker lost mid-round (the rounds since the previous
        checkpoint are redone)."""
        staging = checkpoint.begin(run_location, round_idx)
        names = [f"worker-{i}.npz" for i in range(len(self.workers))]
        bases = checkpoint.next_bases(self.last_chain, self.cfg.engine.full_checkpoint_every)
        try:
            digests = self._get_watching([w.save_state.remote(storage.join(staging, name), not bases)
                                          for w, name in zip(self.workers, names)])
        except RayActorError:
            return RolledBack(round_idx, self._recover())
        meta = {"fingerprint": self.plan.fingerprint, "partition": self.plan.partition_digest,
                "recoveries": self.recoveries, "digests": dict(zip(names, digests)), **checkpoint.new_links(bases)}
        server_state = {name: v for name, v in self.state.items() if name != WEIGHTS}
        server_state |= {f"{MODEL_PREFIX}{version}": model for version, model in self.models.items()}
        self.last_checkpoint = checkpoint.finish(staging, round_idx, self.state[WEIGHTS], meta, names, server_state)
        self.last_chain = checkpoint.links_of(meta, storage.parent_and_name(self.last_checkpoint)[1])
        return self.last_checkpoint

    def restore(self, ckpt: str | None) -> int:
        """Load the global state and every worker's clients from ``ckpt`` (None: round 0). Returns its round.
        A worker lost meanwhile (also one dying while it starts) is replaced, bounded like any other loss."""
        try:
            return self._restore(ckpt)
        except RayActorError:
            self.last_checkpoint = ckpt
            return self._recover()

    def _restore(self, ckpt: str | None) -> int:
        if ckpt is None:
            round_idx, self.state, self.last_chain, self.models = 0, self._initial_state(), [], {}
        else:
            with storage.local_folder(ckpt) as local:
                state, global_vector, server_state = checkpoint.read_state(local, self.plan.fingerprint, self.shared_size)
            round_idx = int(state["round"])
            self.models = {int(name[len(MODEL_PREFIX):]): v for name, v in server_state.items()
                           if name.startswith(MODEL_PREFIX)}
            self.state = self._checked_state(ckpt, {WEIGHTS: global_vector, **{
                name: v for name, v in server_state.items() if not name.startswith(MODEL_PREFIX)}})
            self.last_chain = checkpoint.links_of(state, storage.parent_and_name(ckpt)[1])
        self._get_from_each([w.load_state.remote(ckpt) for w in self.workers])
        self.broadcast_ref = self._publish()
        self.times_sampled = self._times_sampled_until(round_idx)
        self.last_checkpoint = ckpt
        return round_idx

    def _checked_state(self, ckpt: str, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A checkpoint's server state, refused unless it holds exactly the entries, shapes and types this method's
        server starts with (a checkpoint is input: an edited server.npz must not change what the run computes)."""
        expected = {name: (v.shape, v.dtype) for name, v in self._initial_state().items()}
        found = {name: (v.shape, v.dtype) for name, v in state.items()}
        if found != expected:
            wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))[0]
            raise checkpoint.CheckpointError(f"{ckpt}: server state {wrong!r} is {found.get(wrong, 'missing')}, this "
                                             f"run's server holds {expected.get(wrong, 'no such entry')}; resume with "
                                             "the run's own config, or delete the checkpoint")
        return state

    def _times_sampled_until(self, round_idx: int) -> np.ndarray:
        counts = np.zeros(self.num_clients, np.int64)
        for r in range(1, round_idx + 1):  # sampling is a function of (seed, round): recomputed, not stored
            counts[self.plan.sampled(r)] += 1
        return counts

    def _recover(self) -> int:
        """Replace dead workers and roll everyone back to the last checkpoint: every client's work since
        then is redone from the same inputs, so the results equal those of a fault-free run."""
        lost = []
        for index, worker in enumerate(self.workers):
            try:
                ray.get(worker.ping.remote(), timeout=PING_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                ray.kill(worker)
                lost.append(index)
                self.workers[index] = self.spawn(self.assignments[index], self.bundles[index])
        self.recoveries += 1
        self.losses_in_a_row += 1
        if self.losses_in_a_row > self.cfg.engine.max_recoveries:
            raise WorkerLost(self._describe_loss(lost))
        return self.restore(self.last_checkpoint)

    def _describe_loss(self, lost: list[int]) -> str:
        index = lost[0] if lost else min(self.unresponsive, default=0)
        how = "stopped answering pings" if index in self.unresponsive else "died"
        return (f"{self._name_worker(index)} {how} {self.losses_in_a_row} times in a row, more than "
                f"engine.max_recoveries={self.cfg.engine.max_recoveries}; check its memory (a smaller "
                "train.batch_size or fewer engine.workers per machine) or the client module")

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)


ServerActor = ray.remote(Server)
