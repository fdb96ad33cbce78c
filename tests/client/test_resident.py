"""The worker's resident state (``fedsim/client/resident.py``): the guard of its exact sum, reached the way a round
reaches it (a runtime training clients and summing their uploads)."""
import pytest

from fedsim.algorithms import WEIGHTS
from fedsim.algorithms.fedper import FedPer


class UploadsItsHead(FedPer):
    """FedPer whose client uploads the whole model as its weights: the personal head too."""
    name = "uploads_its_head"

    def client_update(self, ctx):
        losses = super().client_update(ctx)
        ctx.upload(WEIGHTS, ctx.pack("full"))
        return losses


def test_the_worker_guard_refuses_an_oversized_payload(data_root):
    from conftest import client_runtime

    from fedsim.core.aggregate import FixedPoint
    from fedsim.core.protocol import FixedPointScales

    rt = client_runtime(data_root, f"{__name__}:UploadsItsHead")
    shared = rt.layouts["shared"]
    assert rt.layouts["full"].size > shared.size  # FedPer's head is personal: it must never reach the server
    weights = shared.pack()
    scaling = FixedPointScales({WEIGHTS: FixedPoint.plan(weights, shared.offsets, 1000)}, {WEIGHTS: False})
    with pytest.raises(RuntimeError, match="personal weights"):
        rt.train_and_sum({WEIGHTS: weights}, [0], 1, scaling)
    assert len(rt.slots["personal"]) == 0  # refused before the client's round was kept
