import numpy as np
import pytest
import torch

from fedsim.engine.aggregate import weighted_average
from fedsim.engine.driver import owner_of, sample_clients
from fedsim.engine.weights import Layout
from fedsim.models import build_model


def test_weights_are_sample_count_proportional():
    a, b, c = np.full(3, 1.0, np.float32), np.full(3, 2.0, np.float32), np.full(3, 4.0, np.float32)
    out = weighted_average([(0, 10, a), (1, 30, b), (2, 60, c)])
    np.testing.assert_allclose(out, (10 * 1 + 30 * 2 + 60 * 4) / 100)
    assert out.dtype == np.float32


def test_average_independent_of_arrival_order():
    rng = np.random.default_rng(0)
    ups = [(i, int(rng.integers(1, 100)), rng.standard_normal(1000).astype(np.float32)) for i in range(20)]
    first = weighted_average(ups)
    assert np.array_equal(first, weighted_average(ups[::-1]))
    assert np.array_equal(first, weighted_average(ups[7:] + ups[:7]))


def test_average_rejects_empty_or_zero_samples():
    with pytest.raises(ValueError):
        weighted_average([])
    with pytest.raises(ValueError):
        weighted_average([(0, 0, np.zeros(2, np.float32))])


def test_layout_roundtrip_and_read_only_input():
    net = build_model("cnn4", 10, (3, 32, 32))
    keys, _ = net.split_keys(1)
    layout = Layout.of(net, keys)
    vec = layout.pack(net)
    assert vec.shape == (layout.size,)
    other = build_model("cnn4", 10, (3, 32, 32))
    frozen = vec.copy()
    frozen.flags.writeable = False  # what Ray's object store hands a worker
    layout.unpack_into(other, frozen)
    for k in keys:
        assert torch.equal(net.state_dict()[k], other.state_dict()[k])
    assert not torch.equal(net.classifier[-1].weight, other.classifier[-1].weight)  # head untouched


def test_sampling_is_seeded_and_sized():
    s = sample_clients(3, 5, 100, 0.1)
    assert s == sample_clients(3, 5, 100, 0.1) and len(s) == 10 and len(set(s)) == 10
    assert s != sample_clients(3, 6, 100, 0.1)
    assert sample_clients(0, 1, 10, 0.01) and len(sample_clients(0, 1, 10, 1.0)) == 10


def test_ownership_is_fixed_and_covers_all_workers():
    owners = [owner_of(c, 3) for c in range(30)]
    assert sorted(set(owners)) == [0, 1, 2] and owners == [owner_of(c, 3) for c in range(30)]
