"""A user's own code, named from configs as ``user_plugins:<name>`` (tests/test_plugins.py): nothing
here is part of fedsim, and fedsim is not edited to use it."""
import numpy as np
import torch
from torch import nn

from fedsim.algorithms import WEIGHTS, PartialSharing
from fedsim.models.lightning import FedClient
from fedsim.data import ArrayDataset
from fedsim.models import SplitNet


class HalfStep(PartialSharing):
    """FedAvg that moves the global weights only halfway to the clients' average"""
    name, train, share = "half_step", "full", "full"

    def server_update(self, state, means, sampled, num_clients):
        state[WEIGHTS] = ((state[WEIGHTS] + means[WEIGHTS]) / 2).astype(np.float32)


def tiny_net(num_classes: int, in_channels: int, image_size: int) -> SplitNet:
    width = in_channels * image_size * image_size
    return SplitNet(nn.Flatten(), [nn.Sequential(nn.Linear(width, 16), nn.ReLU())], nn.Linear(16, num_classes))


def blobs(root, options) -> ArrayDataset:
    """Four Gaussian blobs as 1x1 'images' with 8 channels."""
    rng = np.random.default_rng(options.get("seed", 0))
    centres = rng.normal(0, 3, (4, 8))

    def draw(n):
        y = rng.permutation(np.arange(n) % 4)
        return (centres[y] + rng.normal(0, 1, (n, 8))).astype(np.float32).reshape(n, 1, 1, 8), y.astype(np.int64)

    (train_x, train_y), (test_x, test_y) = draw(400), draw(100)
    return ArrayDataset("blobs", train_x, train_y, test_x, test_y, ("a", "b", "c", "d"), (0.0,) * 8, (1.0,) * 8,
                        augmentable=False)


def round_robin(train_y, test_y, num_clients, rng):
    """Sample i goes to client i mod num_clients (``rng`` unused: this split draws nothing)."""
    return ([np.arange(c, len(train_y), num_clients) for c in range(num_clients)],
            [np.arange(c, len(test_y), num_clients) for c in range(num_clients)])


def bn_net(num_classes: int, in_channels: int, image_size: int) -> SplitNet:
    """A small MLP with BatchNorm in each block, for methods that treat BatchNorm layers apart."""
    width = in_channels * image_size * image_size

    def block(c_in: int) -> nn.Sequential:
        return nn.Sequential(nn.Linear(c_in, 32), nn.BatchNorm1d(32), nn.ReLU())

    return SplitNet(nn.Flatten(), [block(width), block(32)], nn.Linear(32, num_classes))


class LabelSmoothingClient(FedClient):
    """A user's own LightningModule: the same contract with another loss."""

    def loss(self, batch):
        self.smoothed_steps = getattr(self, "smoothed_steps", 0) + 1
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y, label_smoothing=0.1)
