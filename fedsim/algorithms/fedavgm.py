import numpy as np
from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing
from fedsim.core.protocol import WEIGHTS


class FedAvgMParams(Params):
    server_lr: float = Field(1.0, gt=0, description="server learning rate eta applied to the momentum")
    momentum: float = Field(0.9, ge=0, lt=1, description="server momentum beta; 0 with server_lr 1 is FedAvg bit for bit")


class FedAvgM(PartialSharing):
    """FedAvg with server momentum on the pseudo-gradient w - avg (Hsu et al. 2019)"""
    name, train, share = "fedavgm", "full", "full"
    Params = FedAvgMParams
    params: FedAvgMParams
    server_slots = ("momentum",)

    server_update_by_tensor = True  # element by element

    def server_update(self, state: dict[str, np.ndarray], means: dict[str, np.ndarray], sampled: int,
                      num_clients: int) -> None:
        # m' = beta m + (w - avg); w' = w - eta m'. Written as avg - (eta - 1)(w - avg) - eta beta m, the same
        # value, so that beta = 0 and eta = 1 reproduce FedAvg's average exactly (no w - (w - avg) rounding).
        p, avg, weights = self.params, means[WEIGHTS], state[WEIGHTS].astype(np.float64)
        delta = weights - avg
        momentum = state["momentum"].astype(np.float64)
        state[WEIGHTS] = (avg - (p.server_lr - 1) * delta - p.server_lr * p.momentum * momentum).astype(np.float32)
        state["momentum"] = (p.momentum * momentum + delta).astype(np.float32)
