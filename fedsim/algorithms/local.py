from fedsim.algorithms.base import PartialSharing


class Local(PartialSharing):
    """each client trains alone; nothing is shared"""
    name, train, share = "local", "full", "none"
