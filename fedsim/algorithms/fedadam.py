import numpy as np
from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing
from fedsim.core.protocol import WEIGHTS


class FedAdamParams(Params):
    server_lr: float = Field(0.01, gt=0, description="server learning rate eta")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay")
    tau: float = Field(1e-3, gt=0, description="adaptivity: added to sqrt(v)")


class FedAdam(PartialSharing):
    """FedAvg's average as a pseudo-gradient for a server-side Adam (Reddi et al. 2021)"""
    name, train, share = "fedadam", "full", "full"
    Params = FedAdamParams
    params: FedAdamParams
    server_slots = ("m", "v")

    server_update_by_tensor = True  # element by element

    def server_update(self, state: dict[str, np.ndarray], means: dict[str, np.ndarray], sampled: int,
                      num_clients: int) -> None:
        p = self.params
        weights = state[WEIGHTS].astype(np.float64)
        delta = means[WEIGHTS] - weights  # Delta_t = mean of client updates y_i - w
        m = p.beta1 * state["m"] + (1 - p.beta1) * delta
        v = self.second_moment(state["v"].astype(np.float64), delta * delta)
        state[WEIGHTS] = (weights + p.server_lr * m / (np.sqrt(v) + p.tau)).astype(np.float32)
        state["m"], state["v"] = m.astype(np.float32), v.astype(np.float32)

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> np.ndarray:
        return self.params.beta2 * v + (1 - self.params.beta2) * squared
