from pydantic import Field

from fedsim.algorithms.base import PARTS, Params, PartialSharing


class FedRepParams(Params):
    head_epochs: int = Field(10, ge=0, description="epochs training the head alone on the received body, first")
    body_epochs: int | None = Field(1, ge=1, description="then epochs training the body alone; null: train.local_epochs")


class FedRep(PartialSharing):
    """head epochs on the received body, then body epochs; body shared (Collins et al. 2021)"""
    name, train, share = "fedrep", "body", "body"
    Params = FedRepParams

    def epochs_per_round(self, local_epochs: int) -> int:
        return self.params.head_epochs + (self.params.body_epochs or local_epochs)

    def client_update(self, ctx):
        ctx.load()
        losses = ctx.sgd(PARTS["head"], self.params.head_epochs)
        losses += ctx.sgd(PARTS["body"], self.params.body_epochs or ctx.local_epochs)
        ctx.commit_model()
        return losses
