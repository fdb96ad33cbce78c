import numpy as np
from pydantic import Field

from fedsim.algorithms.base import WEIGHTS, Params, PartialSharing


class FedYogiParams(Params):
    server_lr: float = Field(0.01, gt=0, description="server learning rate eta")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay")
    tau: float = Field(1e-3, gt=0, description="adaptivity: added to sqrt(v)")


class FedYogi(PartialSharing):
    """FedAdam with Yogi's additive second moment, v grows or shrinks by at most (1 - b2) D^2 (Reddi et al. 2021)"""
    name, train, share = "fedyogi", "full", "full"
    Params = FedYogiParams
    server_slots = ("m", "v")

    def server_update(self, state, means, sampled, num_clients):
        p = self.params
        weights = state[WEIGHTS].astype(np.float64)
        delta = means[WEIGHTS] - weights
        squared = delta * delta
        m = p.beta1 * state["m"] + (1 - p.beta1) * delta
        v = state["v"] - (1 - p.beta2) * squared * np.sign(state["v"] - squared)
        state[WEIGHTS] = (weights + p.server_lr * m / (np.sqrt(v) + p.tau)).astype(np.float32)
        state["m"], state["v"] = m.astype(np.float32), v.astype(np.float32)
