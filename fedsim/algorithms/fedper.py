from pydantic import Field

from fedsim.algorithms.base import Params, PartialSharing


class FedPerParams(Params):
    keep_personal: bool = Field(
        True, description="personal layers persist across rounds (the paper's Algorithm 1); false discards them "
        "after each round, as the FedBABU authors' main_fed.py runs FedPer: every client trains from, and is "
        "fine-tuned at evaluation from, the initial head")


class FedPer(PartialSharing):
    """base averaged, personal layers never leave the client (Arivazhagan et al. 2019)"""
    name, train, share = "fedper", "full", "body"
    Params = FedPerParams
    params: FedPerParams

    @property
    def keeps_personal(self) -> bool:
        return self.params.keep_personal
