from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from pydantic import Field

from fedsim.algorithms.base import FEDAVG, PARTS, Algorithm, MechanismState, Params
from fedsim.config.schema import Distribution
from fedsim.core.aggregate import weighted_average
from fedsim.core.protocol import WEIGHTS, Reply

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedsim.algorithms.context import ClientContext
    from fedsim.core.layout import KeyParts

CLUSTER = "cluster"  # the upload naming the cluster a client trained: its index, one float
SIZES = "cluster_sizes"  # server state: how many of the last round's clients chose each cluster (its mechanism)


class IFCAParams(Params):
    clusters: int = Field(2, ge=1, description="k, the number of cluster models (the paper's rotated CIFAR-10 "
                          "experiment, Sec. 5.2: k = 2; rotated MNIST: k = 4)")


class IFCA(Algorithm):
    """k cluster models; each client trains the one with the lowest loss on its data (Ghosh et al. 2020)

    Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020,
    Algorithm 1 with model averaging (option II): every sampled client receives all k models, estimates its
    cluster as argmin_j of model j's loss on its training data, runs local SGD on that model and sends it back
    with the cluster's index; the server averages each cluster's returned models, weighted by training samples
    as FedAvg (the paper's machines hold equal data, where this is its plain mean); a cluster nobody chose keeps
    its model. The whole model is shared (with model.personal_layers the head trains and is averaged too). A
    client is scored with the cluster model it would choose. The server's ``weights`` entry is the model of the
    cluster most training samples chose in the last round (cluster 0 before any): with k = 1, FedAvg's model.
    """
    name, train, share = "ifca", "full", "full"
    # Ghosh et al. 2020 (IFCA), Sec. 5: k = 2 (rotated CIFAR-10) and k = 4 (rotated MNIST).
    tunable = {"clusters": Distribution(choice=[2, 4])}
    Params = IFCAParams
    params: IFCAParams
    uploads = {WEIGHTS: None, CLUSTER: None}
    broadcast = ("clusters",)
    aggregation = "replies"  # each upload counts only in its own cluster's average

    def check_run(self, num_clients: int, per_round: int) -> None:
        if self.params.clusters > num_clients:
            raise ValueError(f"algorithm.clusters: {self.params.clusters} clusters for {num_clients} clients that "
                             f"train; at most {num_clients}")

    # -- client ----------------------------------------------------------------------------------
    def client_update(self, ctx: ClientContext) -> list[torch.Tensor]:
        clusters = ctx.broadcast["clusters"]
        chosen = self._estimate_cluster(ctx, clusters)
        ctx.load(weights=clusters[chosen])
        losses = ctx.sgd(PARTS[self.train], ctx.local_epochs)
        ctx.commit_model()
        ctx.upload(CLUSTER, np.array([chosen], np.float32))
        return losses

    def load_for_evaluation(self, ctx: ClientContext) -> None:
        clusters = ctx.broadcast["clusters"]
        ctx.load(weights=clusters[self._estimate_cluster(ctx, clusters)])

    @staticmethod
    def _estimate_cluster(ctx: ClientContext, clusters: np.ndarray) -> int:
        """argmin_j of cluster model j's mean loss on the client's training data (the first on ties)."""
        losses = []
        for model in clusters:
            ctx.load(weights=model)
            losses.append(ctx.score()[0])
        return int(np.argmin(losses))

    # -- server ----------------------------------------------------------------------------------
    def init_model(self, net: nn.Module, keys: KeyParts) -> None:
        # Where each parameter tensor lies in the shared vector (layouts list the state dict's keys in order), for
        # the server's initialisation of the clusters.
        shared, params = self.shared_keys(keys), {k for k, _ in net.named_parameters()}
        self.parameter_spans: list[tuple[int, int]] = []
        start = 0
        for key, tensor in net.state_dict().items():
            if key in shared:
                if key in params:
                    self.parameter_spans.append((start, start + tensor.numel()))
                start += tensor.numel()

    def server_state(self, initial: np.ndarray, num_clients: int, seed: int) -> dict[str, np.ndarray]:
        """Cluster 0 is the round-0 model; the paper initialises every cluster at random. torch's initialisers
        draw a tensor's values independently from one distribution (uniform for convolutions and linear layers,
        constants for BatchNorm's affine weights), so a random permutation of each parameter tensor's values is a
        fresh draw from the same initialiser, without torch on the server: cluster c >= 1 permutes them with
        numpy's Generator([seed, c]). BatchNorm's statistics stay the round-0 ones."""
        clusters = np.tile(initial, (self.params.clusters, 1))
        for c in range(1, self.params.clusters):
            rng = np.random.default_rng([seed, c])
            for start, end in self.parameter_spans:
                clusters[c, start:end] = rng.permutation(initial[start:end])
        return {WEIGHTS: initial, "clusters": clusters, SIZES: np.zeros(self.params.clusters, np.float32)}

    def mechanism(self, state: dict[str, np.ndarray]) -> dict[str, float]:
        """How many clusters the round's clients chose (1: IFCA trained one model, FedAvg's), the largest one's share
        of them, and each cluster's clients."""
        sizes = state[SIZES]
        return {"ifca_clusters_used": float((sizes > 0).sum()),
                "ifca_largest_share": float(sizes.max() / sizes.sum()) if sizes.sum() else 0.0,
                **{f"ifca_cluster_{c}_clients": float(n) for c, n in enumerate(sizes)}}

    def mechanism_state(self, final: Mapping[str, float]) -> MechanismState | None:
        if "ifca_clusters_used" not in final:
            return None
        used = int(final["ifca_clusters_used"])
        return MechanismState(f"{used} of {self.params.clusters} clusters used", FEDAVG if used <= 1 else None)

    def server_replies(self, state: dict[str, np.ndarray], replies: list[Reply], num_clients: int) -> None:
        members: dict[int, list[Reply]] = {}
        for reply in replies:
            members.setdefault(int(reply.uploads[CLUSTER][0]), []).append(reply)
        clusters = state["clusters"].copy()
        for c, chose in members.items():
            clusters[c] = weighted_average([(r.client, r.n_train, r.uploads[WEIGHTS]) for r in chose])
        state["clusters"] = clusters
        state[SIZES] = np.array([len(members.get(c, ())) for c in range(len(clusters))], np.float32)
        # The most chosen cluster by training samples (the lowest index on ties): the run's one saved model.
        samples = {c: sum(r.n_train for r in chose) for c, chose in members.items()}
        state[WEIGHTS] = clusters[min(samples, key=lambda c: (-samples[c], c))].copy()
