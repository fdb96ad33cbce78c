import numpy as np

from fedsim.algorithms.fedadam import FedAdam


class FedYogi(FedAdam):
    """FedAdam with Yogi's additive second moment, v grows or shrinks by at most (1 - b2) D^2 (Reddi et al. 2021)"""
    name = "fedyogi"

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> np.ndarray:
        moment: np.ndarray = v - (1 - self.params.beta2) * squared * np.sign(v - squared)
        return moment
