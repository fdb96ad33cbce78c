from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import LOCAL, PARTS, Algorithm, Group, MechanismState, Params
from fedsim.core.aggregate import weighted_average
from fedsim.core.protocol import WEIGHTS, Reply

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext

MODEL = "model"  # the client slot: its own model's shared part after its last local update
AFFINITY = "affinity"  # upload: the first-order weight of each downloaded model, before clipping
IDS = "ids"  # upload: the clients those models came from (floats holding integers)


class FedFomoParams(Params):
    models_to_download: int = Field(4, ge=1, description="M, other clients' models each training client receives "
                                    "(the authors' README run '5 models': --num_update_clients 4, the client's own "
                                    "model being the fifth)")
    epsilon: float = Field(0.3, ge=0, le=1, description="epsilon-greedy: chance that a download slot takes a random "
                           "client instead of the next highest affinity (authors' configs.py / README: 0.3)")
    epsilon_decay: float = Field(0.05, ge=0, description="subtracted from epsilon per server update (authors' "
                                 "README: 0.05; their counter steps per local epoch)")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="share of a client's training data held out to weigh "
                                "the downloaded models, not trained on (authors' --train_split 0.8; PFLlib val_ratio)")


class FedFomo(Algorithm):
    """own model plus downloaded ones weighted by loss drop per distance on held-out data (Zhang et al. 2021)

    Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First Order Model Optimization",
    ICLR 2021, Sec. 3 and Algorithm 1. The server keeps every client's latest model and an affinity matrix P
    (zeros: the authors' client_weights for other clients). A training client i receives M other clients' models,
    chosen epsilon-greedily by P[i] (ties in random order, as the authors' lexsort), the draws from numpy's
    Generator([seed, server updates so far, i]). On its validation split it weighs each by
    w_ij = (L_i(theta_i) - L_i(theta_j)) / ||theta_j - theta_i|| (the L2 distance over the parameters, PFLlib's
    model.parameters(): BatchNorm statistics are no direction of the loss; 0 for an identical model), clips them
    at 0, normalises, and moves to theta_i + sum_j w_ij (theta_j - theta_i) (its own model if none is positive),
    every value of the shared model included, as the authors' state dicts; then it trains on the rest of its
    data (authors and PFLlib alike). theta_i is the model its last local update left (the paper's theta_i^(t-1)).
    It uploads the trained model and the unclipped w_ij (PFLlib's weight_vector), which the server adds to
    P[i, j]. A client is scored with its own model. The server's ``weights`` entry is the sample-weighted mean of
    the round's returned models; the server holds N models, so its memory grows with the population.
    """
    name, train, share = "fedfomo", "full", "full"
    Params = FedFomoParams
    params: FedFomoParams
    client_slots = {MODEL: "shared"}
    uploads = {WEIGHTS: None, AFFINITY: None, IDS: None}
    broadcast = ()  # each training client gets models of its own (broadcast_groups); scoring needs nothing
    aggregation = "replies"  # each reply fills its own row of the server's models and of P

    def check_run(self, num_clients: int, per_round: int) -> None:
        if self.params.models_to_download > num_clients - 1:
            raise ValueError(f"algorithm.models_to_download: {self.params.models_to_download} other clients' models "
                             f"for {num_clients} clients that train; at most {num_clients - 1}")

    # -- client ----------------------------------------------------------------------------------
    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        import torch

        own = self._own_model(ctx)
        models, ids = ctx.broadcast["models"], ctx.broadcast[IDS]
        x, y = ctx.data()
        train, held = (torch.as_tensor(i, device=y.device) for i in validation_split(len(y), self.params.val_fraction))
        raw = self._first_order_weights(ctx, own, models, (x[held], y[held]))
        ctx.load(weights=combined(own, models, raw))
        # How many downloaded models entered the combination (0: the client kept its own model) and the largest share.
        positive = np.maximum(raw, 0)
        ctx.record("fedfomo_models_used", int((positive > 0).sum()))
        ctx.record("fedfomo_weight_max", float(positive.max() / positive.sum()) if positive.sum() > 0 else 0.0)
        losses = ctx.sgd(PARTS[self.train], ctx.local_epochs, data=(x[train], y[train]))
        ctx.commit_model()
        ctx.set_slot(MODEL, ctx.pack("shared"))
        ctx.upload(AFFINITY, raw.astype(np.float32))
        ctx.upload(IDS, ids.astype(np.float32))
        return losses

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        """No downloaded model with a positive weight: each client keeps its own model (local training)."""
        if "fedfomo_models_used" not in final:
            return None
        used = final["fedfomo_models_used"]
        return MechanismState(f"{used:.3g} models used", LOCAL if used == 0 else None)

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        ctx.load(weights=self._own_model(ctx))

    @staticmethod
    def _own_model(ctx: ClientContext) -> np.ndarray:
        return ctx.slot(MODEL, default=ctx.initial("shared"))

    @staticmethod
    def _first_order_weights(ctx: ClientContext, own: np.ndarray, models: np.ndarray,
                             held: tuple[torch.Tensor, torch.Tensor]) -> np.ndarray:
        """w_ij = (L(own) - L(model j)) / ||model j - own|| on the held-out data, unclipped (float64)."""
        ctx.load(weights=own)
        own_loss = ctx.score(*held)[0]
        trained = parameter_mask(ctx, own)
        raw = np.zeros(len(models))
        for j, model in enumerate(models):
            distance = np.linalg.norm((model.astype(np.float64) - own)[trained])
            if distance > 0:
                ctx.load(weights=model)  # with the client's own personal part, if it has one
                raw[j] = (own_loss - ctx.score(*held)[0]) / distance
        return raw

    # -- server ----------------------------------------------------------------------------------
    def server_state(self, initial: np.ndarray, num_clients: int, seed: int) -> dict[str, np.ndarray]:
        return {WEIGHTS: initial, "models": np.tile(initial, (num_clients, 1)),
                "affinity": np.zeros((num_clients, num_clients)),
                # (run seed, server updates so far): the exploration draws' seed and epsilon's decay count
                "exploration": np.array([seed, 0], np.int64)}

    def broadcast_groups(self, state: dict[str, np.ndarray], clients: list[int], training: bool) -> list[Group]:
        if not training:
            return [(list(clients), {})]
        groups = []
        for client in clients:
            ids = self.downloads(state, client)
            groups.append(([client], {"models": state["models"][ids], IDS: ids}))
        return groups

    def downloads(self, state: dict[str, np.ndarray], client: int) -> np.ndarray:
        """The M other clients whose models ``client`` receives: each slot is, with probability epsilon_t, the next
        of a random order of the others, else the next by affinity P[client] (the authors' get_federating_clients);
        a client already chosen is passed over."""
        seed, updates = (int(v) for v in state["exploration"])
        rng = np.random.default_rng([seed, updates, client])
        affinity = state["affinity"][client]
        others = np.delete(np.arange(affinity.size), client)
        by_affinity = list(others[np.lexsort((rng.random(others.size), -affinity[others]))])
        at_random = list(rng.permutation(others))
        epsilon = max(0.0, self.params.epsilon - self.params.epsilon_decay * updates)
        chosen: list[int] = []
        for explore in rng.random(self.params.models_to_download) < epsilon:
            chosen.append(next(int(c) for c in (at_random if explore else by_affinity) if c not in chosen))
        return np.array(chosen, np.int64)

    def server_replies(self, state: dict[str, np.ndarray], replies: list[Reply], num_clients: int) -> None:
        models, affinity = state["models"].copy(), state["affinity"].copy()
        for reply in replies:
            models[reply.client] = reply.uploads[WEIGHTS]
            affinity[reply.client, reply.uploads[IDS].astype(np.int64)] += reply.uploads[AFFINITY]
        state["models"], state["affinity"] = models, affinity
        state[WEIGHTS] = weighted_average([(r.client, r.n_train, r.uploads[WEIGHTS]) for r in replies])
        state["exploration"] = state["exploration"] + np.array([0, 1])


def validation_split(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(training positions, validation positions) of a client's n samples: int(fraction n) of them (at least one,
    and one left to train on), evenly spaced, so the split is fixed across rounds whatever order the data is stored
    in. A single sample serves as both."""
    if n < 2:
        return np.arange(n), np.arange(n)
    held = min(max(int(fraction * n), 1), n - 1)
    validation = np.arange(held) * n // held
    return np.setdiff1d(np.arange(n), validation), validation


def combined(own: np.ndarray, models: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """theta_i + sum_j w_j (theta_j - theta_i) with w = max(raw, 0) normalised; theta_i if no w_j is positive."""
    weights = np.maximum(raw, 0)
    if weights.sum() <= 0:
        return own
    weights = weights / weights.sum()
    step = sum(w * (m.astype(np.float64) - own) for w, m in zip(weights, models) if w > 0)
    mixed: np.ndarray = (own + step).astype(np.float32)
    return mixed


def parameter_mask(ctx: ClientContext, shared: np.ndarray) -> np.ndarray:
    """Which values of a shared vector are parameters (not BatchNorm's statistics or step counter)."""
    import torch

    parameters = {key for key, _ in ctx.net.named_parameters()}
    flags = {key: torch.full_like(t, key in parameters) for key, t in ctx.tensors("shared", shared).items()}
    return ctx.vector("shared", flags) > 0
