"""What a worker hands the server of its clients' round (fedsim/client/reduce.py): one loop decides which clients
count, for sums and replies alike."""
import numpy as np
import torch

from fedsim.client.reduce import ClientReplies, ClientSums, Trained, reduce_clients
from fedsim.core.aggregate import FixedPoint
from fedsim.core.protocol import FixedPointScales
from fedsim.privacy.secagg import PairwiseMasks


def _trained(loss: float, upload: list[float]) -> Trained:
    return Trained(10, torch.tensor(loss), {"weights": torch.tensor(upload)}, {"personal": np.ones(2, np.float32)}, {})


def test_replies_keep_only_clients_whose_loss_and_uploads_are_finite():
    kept = []
    replies = ClientReplies()
    rounds = [_trained(0.5, [1.0, 2.0]), _trained(0.5, [np.nan, 0.0]), _trained(np.inf, [1.0, 1.0])]
    answer = replies.answer(reduce_clients([4, 5, 6], rounds, replies, lambda client, t: kept.append(client)))
    assert kept == [4] and [r.client for r in answer.replies] == [4]
    assert [(r.diverged, r.out_of_range) for r in answer.reports] == [(False, False), (True, True), (True, False)]
    assert answer.reports[0].bytes_up > 0 and answer.reports[1].bytes_up == 0


def test_sums_mask_each_kept_client_and_only_the_kept():
    # Secure aggregation: the partial is the kept clients' quanta plus their masks (mod 2^64), never a diverged
    # client's mask; the server's recovery then leaves the plain sum of the kept clients.
    scaling = FixedPointScales({"weights": FixedPoint.plan(np.ones(3, np.float32), (0, 3), 30)}, {"weights": False})
    masks = PairwiseMasks(seed=2, round=1, cohort=(4, 5, 6, 9))  # client 9 trains on another worker
    rounds = [_trained(0.5, [1.0, -2.0, 0.25]), _trained(np.inf, [1.0, 1.0, 1.0]), _trained(0.5, [0.5, 0.5, -1.0])]
    plain, masked = ClientSums(scaling, torch.device("cpu")), ClientSums(scaling, torch.device("cpu"), masks)
    for sums in (plain, masked):
        reduce_clients([4, 5, 6], rounds, sums, lambda client, t: None)
    words = {c: masks.mask(c, {"weights": 3})["weights"] for c in (4, 6)}
    expected = plain.sums["weights"].total.numpy().view(np.uint64) + words[4] + words[6]
    np.testing.assert_array_equal(masked.sums["weights"].total.numpy().view(np.uint64), expected)
    totals = {"weights": masked.sums["weights"].total.numpy().copy()}
    totals["weights"] += masks.mask(9, {"weights": 3})["weights"].view(np.int64)  # client 9's partial: a zero upload
    masks.unmask(totals, [4, 6, 9])
    np.testing.assert_array_equal(totals["weights"], plain.sums["weights"].total.numpy())
