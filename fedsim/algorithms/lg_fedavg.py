from fedsim.algorithms.base import PartialSharing


class LGFedAvg(PartialSharing):
    """local representation, global head: only the head is averaged (Liang et al. 2020)"""
    name, train, share = "lg_fedavg", "full", "head"
