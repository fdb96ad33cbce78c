"""The server: owns the global state, samples clients, dispatches them to workers (each client's owner
where clients keep state), and turns their uploads into the next global state through the
algorithm's server hook. Runs as a Ray actor so a submitted job's entrypoint only loops over rounds
and writes results. (In Ray's words the *driver* is the process that calls ``ray.init``: the
entrypoint.)

This module imports no torch: the server's process is up in well under a second while the workers
(started by the entrypoint at the same time) spend ~3 s importing torch and Lightning.

The workers' health, timeouts and replacement are the pool's (``pool.WorkerPool``); FedBuff's asynchronous step
is ``fedbuff``'s; DP's noise and clip norm ``fedsim.privacy.mechanism.ServerPrivacy``'s, secure aggregation's
recovery ``fedsim.privacy.secagg``'s. Past ~350 lines: a round's steps read in one place, in order."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from fedsim import storage
from fedsim.core import checkpoint
from fedsim.core.aggregate import FixedPoint, RoundSums
from fedsim.core.pages import release_shared
from fedsim.core.protocol import (WEIGHTS, ClientReport, FixedPointScales, Reply, RolledBack, RoundFailed,
                                  RoundOutcome, RoundResult, arrays_bytes)
from fedsim.core.robust import robust_means
from fedsim.engine.fedbuff import FedBuff
from fedsim.engine.pool import Spawn, WorkerPool
from fedsim.errors import CheckpointError
from fedsim.plan import RunPlan, balanced_owners
from fedsim.plan.system import RoundTime
from fedsim.privacy.mechanism import ServerPrivacy
from fedsim.privacy.secagg import PairwiseMasks


def _signature(state: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {name: (v.shape, v.dtype) for name, v in state.items()}


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class Server:
    """``workers[i]`` hosts ``plan.assignments[i]``; the entrypoint spawns them so they start while this actor
    does, and the pool's ``spawn`` replaces one that is lost (in its bundle, with the same clients)."""

    def __init__(self, plan: RunPlan, workers: list, spawn: Spawn, bundles: list | None = None):
        self.plan = plan
        self.cfg = plan.cfg
        self.algorithm = plan.algorithm
        self.pool = WorkerPool(workers, plan.assignments, spawn, bundles, plan.cfg.engine)
        self.owner = {c: w for w, clients in enumerate(plan.assignments) for c in clients} if plan.fixed_owners else {}
        self.num_clients = plan.num_clients
        self.shared_size = plan.model.initial["shared"].size
        # Tensor boundaries in the shared vector: fixed-point scales are per tensor.
        self.tensor_offsets = plan.model.layouts["shared"].offsets
        statistics = np.zeros(self.tensor_offsets[-1], bool)  # where the shared vector holds buffers
        for key, _, start, end in plan.model.layouts["shared"].spans():
            statistics[start:end] = key in plan.model.buffers
        # asynchronous rounds: the older models
        self.fedbuff = FedBuff(self.cfg.system.server_lr, statistics, self.cfg.system.server_momentum)
        self.privacy = ServerPrivacy(plan.user_level_dp)  # user-level DP: the clip norm and the noise on the mean
        self.state = plan.initial_server_state()
        # What a checkpoint's server state must match: entries, shapes and types, never the round-0 values.
        self.state_signature = _signature(self.state)
        self.broadcast_ref = self._publish()
        self.bytes_down = arrays_bytes({name: self.state[name] for name in self.algorithm.broadcast})
        self.received: dict[int, int] = {}  # client -> bytes of the broadcast it received this round
        self.times_sampled = np.zeros(self.num_clients, np.int64)
        self.last_checkpoint: str | None = None
        self.last_chain: list[list[str]] = []  # the last checkpoint's bases and itself: what the next delta builds on

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

    def worker_info(self) -> list[dict]:
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
        start, start_cpu = time.perf_counter(), time.process_time()
        timing = self.plan.timing(round_idx)
        sampled = self.plan.sampled(round_idx)  # on the virtual clock, possibly nobody (all dropped or late)
        replying = self.plan.sees_replies
        scaling = self._fixed_point_scales(sampled, timing) if sampled and not replying else None
        masks = self.plan.pairwise_masks(round_idx) if scaling else None
        sums = RoundSums(scaling.scales if scaling else (), self.shared_size)
        reports: list[ClientReport] = []
        replies: list[Reply] = []
        for _, partial in self.pool.as_completed(self._training_calls(sampled, round_idx, scaling, timing, masks)):
            if replying:
                replies += partial.replies
            else:
                sums.add(partial.sums, partial.weights)  # then dropped: W partials are never held at once
            reports += partial.reports
        if masks is not None:  # secure aggregation's recovery: the totals become the kept clients' plain sum
            masks.unmask(sums.totals, [r.client for r in reports if not r.diverged])
        # In client order, so logs and the client an error names do not depend on how work was split.
        reports.sort(key=lambda r: r.client)
        diverged = [r for r in reports if r.diverged]
        kept = [r for r in reports if not r.diverged]
        failure = self._failure(round_idx, diverged, kept)
        if failure:
            return RoundFailed(round_idx, failure)
        # An asynchronous step: the model clients still in flight started from, kept with the step's timing.
        previous = (self.state[WEIGHTS], timing) if timing is not None and timing.versions else None
        if replying and kept:
            self._fold_replies(sorted(replies, key=lambda r: r.client))
            del replies  # a model size per client
            self.broadcast_ref = self._publish()
        elif self.shared_size and kept:
            assert scaling is not None  # made for every round that sampled clients and sums their uploads
            self._aggregate(round_idx, scaling, sums, kept, timing)
            del sums  # two model sizes of int64, not to be held while the new state is published and evaluated
            self.broadcast_ref = self._publish()
        elif self.shared_size and self.privacy.releases_empty_rounds:
            self._release_noise_alone(round_idx)
            self.broadcast_ref = self._publish()
        if previous is not None:
            self.fedbuff.keep(*previous)
        self.times_sampled[sampled] += 1
        records = self._evaluate(round_idx, {r.client: r for r in kept}) if self.plan.evaluates(round_idx) else []
        mechanism = self.algorithm.mechanism(self.state) if kept else {}
        privacy = self.privacy.after_round(round_idx, [r.update_norm for r in kept if r.update_norm is not None])
        comm = [{"round": round_idx, "client": r.client, "bytes_down": self.received[r.client], "bytes_up": r.bytes_up}
                for r in kept]
        cpu = time.process_time() - start_cpu + self.pool.cpu_seconds_since_last()
        return RoundResult(round_idx, sampled, [r.client for r in diverged], records, comm, time.perf_counter() - start,
                           cpu, timing=timing.row() if timing else {}, mechanism=mechanism, privacy=privacy,
                           spent=self.plan.privacy_at(round_idx))

    def _failure(self, round_idx: int, diverged: list[ClientReport], kept: list[ClientReport]) -> str | None:
        """Why the run cannot go on after this round's training, if it cannot: a diverged client under
        train.on_nonfinite=stop, or fewer kept replies than the robust rule is defined for."""
        if diverged and self.cfg.train.on_nonfinite == "stop":
            first = diverged[0]
            what = ("its update left the fixed-point range (over 2^16 x the global's largest value)"
                    if first.out_of_range else "training loss is not finite")
            return (f"client {first.client}, round {round_idx}: {what}; lower train.body.lr / train.head.lr, or set "
                    "train.on_nonfinite=drop to skip such updates")
        fewest = self.plan.fewest_replies
        if self.plan.sees_replies and kept and len(kept) < fewest:
            s = self.cfg.server
            return (f"server.aggregator: {s.aggregator} with server.byzantine={s.byzantine} needs {fewest} replies a "
                    f"round, round {round_idx} kept {len(kept)}; lower server.byzantine or sample more clients "
                    "(train.fraction)")
        return None

    def _training_calls(self, sampled: list[int], round_idx: int, scaling: FixedPointScales | None,
                        timing: RoundTime | None, masks: PairwiseMasks | None) -> list:
        """One call per worker and model: a synchronous round sends every client the current model; an
        asynchronous step each client the model it was dispatched with (kept in ``self.fedbuff.models`` since)."""
        current = round_idx - 1
        by_model = {current: sampled}
        if timing is not None and timing.versions:
            by_model = {}
            for client, version in zip(timing.participants, timing.versions):
                by_model.setdefault(version, []).append(client)
        calls, self.received = [], {}
        for version, clients in sorted(by_model.items()):
            older = {WEIGHTS: self.fedbuff.models[version]} if version != current else None
            messages = self._messages(clients, True) if older is None else [(clients, self._put(older), self.bytes_down)]
            for members, ref, size in messages:
                self.received |= dict.fromkeys(members, size)
                for w, cs in self._by_worker(members, self.plan.train_steps).items():
                    worker = self.pool.workers[w]
                    calls.append(worker.train_and_reply.remote(ref, cs, round_idx) if self.plan.sees_replies
                                 else worker.train_and_sum.remote(ref, cs, round_idx, scaling, masks))
        return calls

    def _fixed_point_scales(self, sampled: list[int], timing: RoundTime | None) -> FixedPointScales:
        """Per upload, the fixed-point scale for this round's exact sums: from the server's current value of
        that upload (the global weights for ``weights``) and the sampled clients' total weight; in an
        asynchronous step, each client's staleness factor (1 + s)^-system.staleness_exponent."""
        scales, uniform = {}, {}
        stepping = timing is not None and bool(timing.versions)  # FedBuff's step weighs by system.async_weighting
        default = self.cfg.system.async_weighting if stepping else self.cfg.train.weighting
        for name, weighting in self.algorithm.uploads.items():
            uniform[name] = (weighting or default) == "uniform"
            total = len(sampled) if uniform[name] else sum(self.plan.train_sizes[c] for c in sampled)
            scales[name] = FixedPoint.plan(self.state.get(name, self.state[WEIGHTS]), self.tensor_offsets, total)
        if timing is None or not timing.versions:
            return FixedPointScales(scales, uniform, clip_norm=self.privacy.clip_norm)
        exponent = self.cfg.system.staleness_exponent
        return FixedPointScales(scales, uniform,
                                {c: (1 + s) ** -exponent for c, s in zip(timing.participants, timing.staleness())})

    def _aggregate(self, round_idx: int, scaling: FixedPointScales, sums: RoundSums, kept: list[ClientReport],
                   timing: RoundTime | None) -> None:
        """Turn the exact sums into means and let the algorithm's server hook make the next global state of
        them, tensor by tensor where the hook allows (``Algorithm.server_by_tensor``): float64 means of one tensor
        at a time, never of the whole model; in an asynchronous step, FedBuff's step on the weights' means first;
        under central DP, the weights' mean noised first (``ServerPrivacy.noisy_mean``). The caller publishes the new
        state."""
        # Staleness factors exist only in an asynchronous step, which always has its timing.
        step = self.fedbuff.step(scaling, kept, timing, self.state[WEIGHTS]) \
            if timing is not None and scaling.factors else None
        new = {name: np.empty_like(vector) for name, vector in self.state.items()}
        tensors = range(len(self.tensor_offsets) - 1)
        for group in ([[t] for t in tensors] if self.algorithm.server_by_tensor() else [list(tensors)]):
            start, end = self.tensor_offsets[group[0]], self.tensor_offsets[group[-1] + 1]
            means = {name: _joined([scale.mean(sums.totals[name], sums.weights[name], t) for t in group])
                     for name, scale in scaling.scales.items()}
            means[WEIGHTS] = self.privacy.noisy_mean(round_idx, means[WEIGHTS], self.state[WEIGHTS][start:end],
                                                     self.tensor_offsets, group, len(kept))
            if step:
                means[WEIGHTS] = step.apply(self.state[WEIGHTS], means[WEIGHTS], start, end)
            state = {name: vector[start:end] for name, vector in self.state.items()}
            self.algorithm.server_update(state, means, len(kept), self.num_clients)
            for name, vector in new.items():
                vector[start:end] = state[name]
        for vector in self.state.values():
            release_shared(vector)  # the round-0 state is the plan's, in Ray's object store
        self.state = new

    def _release_noise_alone(self, round_idx: int) -> None:
        """Central DP under Poisson sampling with nobody kept: the round still releases the noise over q x N, as the
        accountant's mechanism does every round (a model left unmoved would tell that the round was empty)."""
        weights = self.state[WEIGHTS].astype(np.float64)
        noisy = self.privacy.noisy_mean(round_idx, weights, weights, self.tensor_offsets,
                                        list(range(len(self.tensor_offsets) - 1)), 0)
        state = dict(self.state)
        self.algorithm.server_update(state, {WEIGHTS: noisy}, 0, self.num_clients)
        self.state = state

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

    def _evaluate(self, round_idx: int, trained: dict[int, ClientReport]) -> list[dict]:
        """Every scored client's record; one trained this round also carries its training loss and what its
        module logged while training (``self.log``)."""
        calls = [self.pool.workers[w].evaluate.remote(ref, cs, round_idx)
                 for members, ref, _ in self._messages(self.plan.scored(round_idx), False)
                 for w, cs in self._by_worker(members, self.plan.test_sizes).items()]
        records = sorted((r for batch in self.pool.get_watching(calls) for r in batch), key=lambda r: r["client"])
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
        names = [f"worker-{i}.npz" for i in range(len(self.pool))]
        bases = checkpoint.next_bases(self.last_chain, self.cfg.engine.full_checkpoint_every)
        try:
            digests = self.pool.get_watching([w.save_state.remote(storage.join(staging, name), not bases)
                                              for w, name in zip(self.pool.workers, names)])
        except RayActorError:
            return RolledBack(round_idx, self._recover())
        meta = {"fingerprint": self.plan.fingerprint, "partition": self.plan.partition_digest,
                "recoveries": self.pool.recoveries, "digests": dict(zip(names, digests)), **checkpoint.new_links(bases)}
        server_state = ({name: v for name, v in self.state.items() if name != WEIGHTS} | self.fedbuff.checkpointed()
                        | self.privacy.checkpointed())
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
            round_idx, self.state, self.last_chain = 0, self.plan.initial_server_state(), []
            self.fedbuff.restore({})  # round 0: no older model is held
            self.privacy.restore({})  # and the initial clip norm
        else:
            with storage.local_folder(ckpt) as local:
                state, global_vector, server_state = checkpoint.read_state(local, self.plan.fingerprint, self.shared_size)
            round_idx = int(state["round"])
            rest = self.fedbuff.restore(self.privacy.restore(server_state))
            self.state = self._checked_state(ckpt, {WEIGHTS: global_vector, **rest})
            self.last_chain = checkpoint.links_of(state, storage.parent_and_name(ckpt)[1])
        self.pool.get_from_each([w.load_state.remote(ckpt) for w in self.pool.workers])
        self.broadcast_ref = self._publish()
        self.times_sampled = self._times_sampled_until(round_idx)
        self.last_checkpoint = ckpt
        return round_idx

    def _checked_state(self, ckpt: str, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A checkpoint's server state, refused unless it holds exactly the entries, shapes and types this method's
        server starts with (a checkpoint is input: an edited server.npz must not change what the run computes)."""
        expected, found = self.state_signature, _signature(state)
        if found != expected:
            wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))[0]
            raise CheckpointError(f"{ckpt}: server state {wrong!r} is {found.get(wrong, 'missing')}, this "
                                             f"run's server holds {expected.get(wrong, 'no such entry')}; resume with "
                                             "the run's own config, or delete the checkpoint")
        return state

    def _times_sampled_until(self, round_idx: int) -> np.ndarray:
        counts = np.zeros(self.num_clients, np.int64)
        for r in range(1, round_idx + 1):  # sampling is a function of (seed, round): recomputed, not stored
            counts[self.plan.sampled(r)] += 1
        return counts

    def _recover(self) -> int:
        """Replace lost workers and roll everyone back to the last checkpoint: every client's work since
        then is redone from the same inputs, so the results equal those of a fault-free run."""
        self.pool.replace_lost()
        return self.restore(self.last_checkpoint)

    def shutdown(self) -> None:
        self.pool.shutdown()


ServerActor = ray.remote(Server)
