from fedsim.algorithms.base import PartialSharing


class FedAvg(PartialSharing):
    """one global model (McMahan et al. 2017)"""
    name, train, share = "fedavg", "full", "full"
