from pydantic import Field

from fedsim.algorithms.base import HeadFirst, HeadFirstParams


class FedPerFTParams(HeadFirstParams):
    head_epochs: int = Field(1, ge=1, description="epochs training the personal layers alone on the new base first")


class FedPerFT(HeadFirst):
    """FedPer with local pre-fine-tuning: head alone on the new base first (FedPer paper, Knowl 8)"""
    name, train, share, then = "fedper_ft", "full", "body", "full"
    Params = FedPerFTParams
    params: FedPerFTParams
