"""A client's randomness is a function of (seed, round, client, stream), never of what its worker ran before."""
import torch

from fedsim.client.randomness import FINETUNE_STREAM, TRAIN_STREAM, global_draws


def _dropout_mask() -> torch.Tensor:
    return torch.nn.functional.dropout(torch.ones(64), 0.5)


def test_global_draws_do_not_depend_on_what_ran_before_and_leave_the_process_sequence_alone():
    with global_draws(7, 3, 2):
        first = _dropout_mask()
    torch.rand(1000)  # another client's work, or a user's own draws
    before = torch.random.get_rng_state()
    with global_draws(7, 3, 2):
        again = _dropout_mask()
    assert torch.equal(first, again)
    assert torch.equal(torch.random.get_rng_state(), before)  # given back as it was


def test_each_client_round_and_stream_draws_its_own():
    masks = []
    for seed, round_idx, client, stream in [(7, 3, 2, TRAIN_STREAM), (7, 3, 1, TRAIN_STREAM), (7, 4, 2, TRAIN_STREAM),
                                            (8, 3, 2, TRAIN_STREAM), (7, 3, 2, FINETUNE_STREAM)]:
        with global_draws(seed, round_idx, client, stream):
            masks.append(_dropout_mask())
    assert all(not torch.equal(a, b) for i, a in enumerate(masks) for b in masks[i + 1:])
