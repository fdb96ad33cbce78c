from fedsim.algorithms.base import PartialSharing


class FedPer(PartialSharing):
    """base averaged, personal layers never leave the client (Arivazhagan et al. 2019)"""
    name, train, share = "fedper", "full", "body"
