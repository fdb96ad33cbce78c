from pydantic import Field

from fedsim.algorithms.base import HeadFirst, HeadFirstParams
from fedsim.config.schema import Distribution


class FedRepParams(HeadFirstParams):
    head_epochs: int = Field(10, ge=0, description="epochs training the head alone on the received body, first")
    body_epochs: int | None = Field(1, ge=1, description="then epochs training the body alone; null: train.local_epochs")


class FedRep(HeadFirst):
    """head epochs on the received body, then body epochs; body shared (Collins et al. 2021)"""
    name, train, share, then = "fedrep", "body", "body", "body"
    # Collins et al. 2021 (FedRep, ICML), Sec. 5: 10 epochs of the head per round; PFLlib's plocal_epochs: 1.
    tunable = {"head_epochs": Distribution(choice=[1, 10])}
    Params = FedRepParams
    params: FedRepParams

    def then_epochs(self, local_epochs: int) -> int:
        return self.params.body_epochs or local_epochs
