"""What an algorithm is: a client hook (the local update) and a server hook (how updates become the
next global model), plus the typed parameters the method takes.

Most personalized-FL methods differ only in *what trains locally* and *what the server averages*;
:class:`PartialSharing` states those two words and runs the common local update, so FedAvg, FedPer,
FedBABU, LG-FedAvg and local-only are a few declarative lines. A method that needs more overrides a
hook in its own file, using the runtime primitives of :class:`~fedsim.algorithms.context.ClientContext`.

This module imports no torch: the server actor builds the algorithm to run its server hook.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from fedsim.config.learning import TrainConfig
from fedsim.config.schema import Distribution
from fedsim.core.layout import KeyParts
from fedsim.core.protocol import WEIGHTS, Reply

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedsim.algorithms.context import ClientContext, Penalty

Part = Literal["full", "body", "head", "none"]
BatchNormMode = Literal["averaged", "personal", "batch_stats", "local_statistics"]
Weighting = Literal["samples", "uniform"]
Aggregation = Literal["sums", "replies"]
Group = tuple[list[int], dict[str, np.ndarray]]  # clients, and what each of them receives

PARTS: dict[str, frozenset[str]] = {
    "full": frozenset({"body", "head"}),
    "body": frozenset({"body"}),
    "head": frozenset({"head"}),
    "none": frozenset(),
}


LOCAL, FEDAVG = "acts as local training", "acts as FedAvg"  # what a method whose mechanism is off reduces to


@dataclass(frozen=True)
class MechanismState:
    """A method's mechanism at the end of a run: its value in a few words ("self-weight 0.62"), and, where the
    mechanism is off, what the method then is (``LOCAL`` or ``FEDAVG``)."""
    value: str
    flag: str | None = None


class Params(BaseModel):
    """Base of every method's parameters: typed, documented, unknown keys refused."""
    # inf/nan are never a method's setting (mu: .inf would train on NaN losses), as in every config section.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class Algorithm:
    """One federated method. Subclasses set the class attributes and override the hooks they need."""

    name: ClassVar[str]  # the class docstring's first line is the method's one-line summary
    Params: ClassVar[type[BaseModel]] = Params
    params: BaseModel  # a ``Params`` instance: a method with parameters narrows it to its own class beside ``Params``
    train: ClassVar[Part] = "full"  # what a client's local update trains (for the default hooks)
    share: ClassVar[Part] = "full"  # what clients send and the server averages and broadcasts
    batchnorm: ClassVar[BatchNormMode] = "averaged"  # the method's default for model.batchnorm
    # What the method does on a model without BatchNorm (the text models, an MLP) where its design assumes one: said
    # at --dry-run and when a run starts (``batchnorm_notice``); None where BatchNorm plays no part in it.
    without_batchnorm: ClassVar[str | None] = None
    # Per-client state kept between rounds beyond the personal part of the model: slot -> its size,
    # "full" (the whole model), "shared" (the shared weights) or a number of values. Not a ClassVar: a method may size
    # a slot on its instance once the model is built (FedRoD's personal head, in init_model).
    client_slots: dict[str, str | int] = {}
    # What each client uploads: name -> weighting of its average (None: the run's train.weighting).
    uploads: ClassVar[dict[str, Weighting | None]] = {WEIGHTS: None}
    # Server state beyond the weights, each a vector the size of the shared weights, starting at zero.
    server_slots: ClassVar[tuple[str, ...]] = ()
    # What the server sends to the clients each round (entries of its state).
    broadcast: ClassVar[tuple[str, ...]] = (WEIGHTS,)
    # Whether the client hook needs only what a packed client offers (context.PackablePort: ClientContext's
    # primitives but ctx.net, ctx.batches, ctx.param_groups, ctx.score, ctx.output_layer and ctx.features, which need
    # the worker's whole RuntimePort), with penalties from ctx.proximal / ctx.linear and no per-step callback: then
    # engine.pack can train several clients as one batched computation. Declared by
    # the class that writes client_update or penalty (see ``packs``): a subclass that overrides either is not packed
    # unless it says so itself.
    packable: ClassVar[bool] = False
    # How the server receives a round's uploads. "sums": each worker sums its clients' weighted uploads exactly (fixed
    # point) and server_update gets the means; a method's uploads are vectors the size of the shared weights.
    # "replies": every kept client's uploads reach the server, which hands them to server_replies in client order
    # (methods that weigh one client's upload against another's: FedAMP, FedFomo, IFCA; uploads of any size). The
    # server then holds one copy of every upload of the round.
    aggregation: ClassVar[Aggregation] = "sums"
    # Why the method's client hook trains with an objective of its own on the network's forward (pFedMe's inner
    # problem, FedRoD's balanced loss), bypassing a LightningModule's training_step; None: it trains through ctx.sgd.
    own_objective: ClassVar[str | None] = None
    # Whether an own server_update works element by element (each value's new state from that value's means and state
    # alone), so the server may call it one tensor at a time.
    server_update_by_tensor: ClassVar[bool] = False
    # The accuracy the method's own protocol reports, which the run's one-line summary shows: "acc", the model each
    # client holds, or "acc_personalized", that model after eval.finetune_epochs of fine-tuning (FedBABU's protocol).
    reports: ClassVar[Literal["acc", "acc_personalized"]] = "acc"
    # What `fedsim tune` searches for this method beside the shared space (lr, momentum, local epochs): its own
    # parameters (as a config names them), each over the values its paper or its authors' code uses, cited where
    # declared. Empty: the method tunes the shared space only.
    tunable: ClassVar[dict[str, Distribution]] = {}
    # Shared settings the method ignores (e.g. "momentum": its steps are plain gradient steps), so a search sets them
    # neutral instead of drawing them, and receipts do not print them.
    unused_settings: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, params: BaseModel | None = None, batchnorm: BatchNormMode | None = None):
        self.params = params if params is not None else self.Params()
        self.bn_mode: BatchNormMode = batchnorm or self.batchnorm  # the run's model.batchnorm, else the method's

    @classmethod
    def packs(cls) -> bool:
        """Whether engine.pack may train this method's clients: ``packable`` is true, and declared by every class
        that wrote one of the hooks packed training runs (a user's subclass of a packable method inherits it only
        if it leaves client_update and penalty alone)."""
        writers = {next(k for k in cls.__mro__ if hook in vars(k)) for hook in ("client_update", "penalty")
                   if any(hook in vars(k) for k in cls.__mro__)}
        return cls.packable and all(vars(w).get("packable", False) for w in writers)

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    def settings_notice(self, train: TrainConfig) -> str | None:
        """The line ``--dry-run`` prints when the method adjusts a shared training setting it is given (pFedMe clamps
        its step to the authors' range); None where it takes them as they are."""
        return None

    def check_run(self, num_clients: int, per_round: int) -> None:
        """Refuse parameters the run's population cannot have (a cluster count above the client count): raise
        ValueError with the one-line reason, naming the parameter; the config check prefixes the method."""

    # -- what is shared --------------------------------------------------------------------------
    def shared_keys(self, keys: KeyParts) -> set[str]:
        """State keys the server holds; everything else stays on the client (its personal part)."""
        shared = keys.of(PARTS[self.share])
        if self.bn_mode == "personal":
            return shared - keys.batchnorm
        return shared - keys.statistics if self.bn_mode == "local_statistics" else shared

    @property
    def keeps_client_state(self) -> bool:
        """Whether anything of a client outlives a round on its worker. If not, any worker can train any
        client, so each round's sample can be balanced over the workers afresh."""
        return self.share != "full" or bool(self.client_slots) or self.bn_mode in ("personal", "local_statistics")

    # -- client hooks ----------------------------------------------------------------------------
    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        """Change the freshly built round-0 network (drawn from the run's seed; ``keys``: its body/head split);
        identical in every process."""

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        """Train one client for one round; returns the per-step losses. Write uploads and state through ``ctx``."""
        raise NotImplementedError

    def epochs_per_round(self, local_epochs: int) -> int:
        """Passes over a sampled client's training data in one round (``fedsim run --dry-run`` counts the work
        with it); a method whose ``client_update`` trains more than ``train.local_epochs`` says so here."""
        return local_epochs

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        """Put the model a client is scored with into ``ctx``'s network."""
        ctx.load()

    def before_finetuning(self, ctx: ClientContext) -> None:
        """Under eval.personalize: finetune, what the method does to the scored model before eval's fine-tuning
        (FedBABU's PFLlib variant: one more local update); nothing it stages is kept. Nothing by default."""

    # -- server hook -----------------------------------------------------------------------------
    def server_update(self, state: dict[str, np.ndarray], means: dict[str, np.ndarray], sampled: int,
                      num_clients: int) -> None:
        """Fold the round's averaged uploads (float64) into the server state (set new values by assignment,
        ``state[name] = ...``; ``state`` holds float32 vectors, ``means`` their averages). By default the new global
        weights are the average (FedAvg / FedPer's aggregation). Called once on whole vectors, or, for a hook that
        declares ``server_update_by_tensor``, once per tensor of the shared layout with that tensor's slices: then
        the server never holds the whole model's float64 means (big models' server memory, BENCHMARKS.md)."""
        state[WEIGHTS] = means[WEIGHTS].astype(np.float32)

    def mechanism(self, state: dict[str, np.ndarray]) -> dict[str, float]:
        """Named scalars that show the method's server-side mechanism at work, read from the server state after a
        round's server step (FedAMP's self-weights, IFCA's cluster sizes): rounds.jsonl keeps them under
        ``mechanism``, W&B as ``mechanism/<name>``, ``fedsim report`` in its mechanism table. A client-side quantity
        (APFL's alpha) is recorded by the client hook with ``ctx.record``. None by default."""
        return {}

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        """The mechanism's value at the run's end and whether it is off, from ``final``: the last value of each of
        the run's ``mechanism`` quantities and recorded (``ctx.record``) means. None: the method has no mechanism of
        its own to show, or the run recorded none."""
        return None

    def server_state(self, initial: np.ndarray, num_clients: int, seed: int) -> dict[str, np.ndarray]:
        """The server's round-0 state from the round-0 shared weights: the weights and every ``server_slots`` entry
        at zero. A method that keeps more (IFCA's cluster models, FedAMP's per-client models) adds it here: any
        shapes, drawn from ``seed`` alone, checkpointed with the run."""
        return {WEIGHTS: initial, **{name: np.zeros_like(initial) for name in self.server_slots}}

    def broadcast_groups(self, state: dict[str, np.ndarray], clients: list[int], training: bool) -> list[Group]:
        """What each of ``clients`` receives before training (``training``) or scoring, as groups of clients that
        receive the same vectors. By default one group: the ``broadcast`` entries of the state. A method that sends
        each client (or each cluster) its own aggregate returns a group per client (or cluster); the server puts
        each group's vectors in Ray's object store once."""
        return [(list(clients), {name: state[name] for name in self.broadcast})]

    @classmethod
    def broadcasts_by_group(cls) -> bool:
        """Whether clients may receive different vectors (an own ``broadcast_groups``)."""
        return cls.broadcast_groups is not Algorithm.broadcast_groups

    def server_replies(self, state: dict[str, np.ndarray], replies: list[Reply], num_clients: int) -> None:
        """Under ``aggregation = "replies"``: fold the round's kept replies (in client order) into the server state,
        setting new values by assignment. Replies come in client order whatever worker trained them, so a hook that
        works through them in order is the same for any number of workers."""
        raise NotImplementedError(f"{self.name}: aggregation = 'replies' needs a server_replies hook")

    @classmethod
    def server_by_tensor(cls) -> bool:
        """Whether the server may call ``server_update`` tensor by tensor: the default hook works element by element;
        a method's own hook only when it says so (a hook that needs a whole-model quantity, a global norm, keeps
        getting whole vectors)."""
        return cls.server_update is Algorithm.server_update or cls.server_update_by_tensor


class PartialSharing(Algorithm):
    """The common family, stated by two words: ``train`` (what local SGD updates) and ``share``."""
    packable = True

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        ctx.load()
        losses = ctx.sgd(PARTS[self.train], ctx.local_epochs, penalty=self.penalty(ctx))
        ctx.commit_model(keep_personal=self.keeps_personal)
        return losses

    def penalty(self, ctx: ClientContext) -> Penalty | None:
        """An extra loss term for local training (FedProx's proximal pull, from ``ctx.proximal``); None for plain
        SGD."""
        return None

    @property
    def keeps_personal(self) -> bool:
        """Whether the layers not shared carry into the client's next round (every personalized paper's
        algorithm); a method that discards them after each round overrides this."""
        return True


class HeadFirstParams(Params):
    """What every :class:`HeadFirst` method's parameters hold (each sets its own default and bounds)."""
    head_epochs: int


class HeadFirst(PartialSharing):
    """The personal head alone on the received base first (``head_epochs``, a parameter of the method), then
    ``then`` trains: FedRep (the body) and FedPer's pre-fine-tuning (the full network) share this shape."""
    then: ClassVar[Part] = "full"
    packable = True
    params: HeadFirstParams

    def then_epochs(self, local_epochs: int) -> int:
        return local_epochs

    def epochs_per_round(self, local_epochs: int) -> int:
        return self.params.head_epochs + self.then_epochs(local_epochs)

    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        ctx.load()
        losses = ctx.sgd(PARTS["head"], self.params.head_epochs)
        losses += ctx.sgd(PARTS[self.then], self.then_epochs(ctx.local_epochs))
        ctx.commit_model(keep_personal=self.keeps_personal)
        return losses


def parameter_table(algorithm: type[Algorithm]) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, description) of a method's parameters, for `fedsim algorithms` and the README."""
    rows = []
    for field_name, field in algorithm.Params.model_fields.items():
        kind = field.annotation
        annotation = kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
        rows.append((field.alias or field_name, annotation, field.default, field.description or ""))
    return rows
