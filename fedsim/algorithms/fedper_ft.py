from pydantic import Field

from fedsim.algorithms.base import PARTS, Params, PartialSharing


class FedPerFTParams(Params):
    head_epochs: int = Field(1, ge=1, description="epochs training the personal layers alone on the new base first")


class FedPerFT(PartialSharing):
    """FedPer with local pre-fine-tuning: head alone on the new base first (FedPer paper, Knowl 8)"""
    name, train, share = "fedper_ft", "full", "body"
    Params = FedPerFTParams

    def epochs_per_round(self, local_epochs: int) -> int:
        return self.params.head_epochs + local_epochs

    def client_update(self, ctx):
        ctx.load()
        losses = ctx.sgd(PARTS["head"], self.params.head_epochs)
        losses += ctx.sgd(PARTS["full"], ctx.local_epochs)
        ctx.commit_model()
        return losses
