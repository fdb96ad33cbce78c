from fedsim.algorithms.base import PartialSharing


class FedBN(PartialSharing):
    """FedAvg with every BatchNorm layer (affine weights and running statistics) kept local (Li et al. 2021)"""
    name, train, share, batchnorm = "fedbn", "full", "full", "personal"
    without_batchnorm = ("fedbn keeps each BatchNorm layer on its client, and this model has none: every layer is "
                         "shared, so it trains and averages as fedavg does")
