"""What a worker hands the server of its clients' round (fedsim/client/reduce.py): one loop decides which clients
count, for sums and replies alike."""
import numpy as np
import torch

from fedsim.client.reduce import ClientReplies, Trained, reduce_clients


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
