"""A user's own code, named from configs as ``user_plugins:<name>`` (tests/test_plugins.py): nothing
here is part of fedsim, and fedsim is not edited to use it."""
import dataclasses
from collections.abc import Sequence

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


def square_only(num_classes: int, in_channels: int, image_size) -> SplitNet:
    """A factory that assumes square images: sized from the height alone (as cnn4 was)."""
    side = image_size if isinstance(image_size, int) else image_size[0]
    return SplitNet(nn.Flatten(), [nn.Linear(in_channels * side * side, 16)], nn.Linear(16, num_classes))


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


def relabelled_blobs(root, options) -> ArrayDataset:
    """``blobs`` with its labels cast to ``options["dtype"]`` and shifted by ``options["shift"]``: a data set that may
    break fedsim's data contract (float labels, labels beyond its classes)."""
    data = blobs(root, {})
    dtype, shift = options.get("dtype", "int64"), options.get("shift", 0)
    return dataclasses.replace(data, train_y=(data.train_y + shift).astype(dtype),
                               test_y=(data.test_y + shift).astype(dtype))


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


# -- A Lightning user's own modules (tests/client/test_lightning_modules.py) ---------------------------------
import collections  # noqa: E402

import pytorch_lightning as pl  # noqa: E402
import torchmetrics  # noqa: E402
from torch.nn import functional as F  # noqa: E402

CALLS: collections.Counter = collections.Counter()  # hooks and callbacks seen, in this process


class TwoPartModule(pl.LightningModule):
    """Written as Lightning users write one: its own network (``body``, ``head``), automatic optimization, one SGD
    with a param group per part, ``self.log`` of a number and of a torchmetrics object, a validation_step."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int, hidden: int = 16,
                 body_lr: float = 0.123, head_lr: float = 0.0456):
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
        self.lrs_seen: list[list[float]] = []

    def forward(self, x):
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc)
        self.log("my_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_margin", self(x).max(dim=1).values.mean())

    def configure_optimizers(self):
        return torch.optim.SGD([{"params": self.body.parameters(), "lr": self.hparams.body_lr},
                                {"params": self.head.parameters(), "lr": self.hparams.head_lr}], momentum=0.5)

    def on_train_start(self):
        CALLS["on_train_start"] += 1

    def on_train_epoch_start(self):
        CALLS["on_train_epoch_start"] += 1
        optimizers = self.optimizers()
        self.lrs_seen.append([g["lr"] for o in (optimizers if isinstance(optimizers, list) else [optimizers])
                              for g in o.param_groups])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        CALLS["on_train_batch_end"] += 1

    def configure_callbacks(self):
        return [CountingCallback()]


class CountingCallback(pl.Callback):
    def on_fit_start(self, trainer, pl_module):
        CALLS["callback.on_fit_start"] += 1

    def on_train_epoch_end(self, trainer, pl_module):
        CALLS[f"callback.epoch_end.{trainer.current_epoch}"] += 1


class ListedCallback(pl.Callback):
    """Named in model.callbacks with init_args."""

    def __init__(self, tag: str = "listed"):
        self.tag = tag

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        CALLS[f"{self.tag}.batch_start"] += 1


class AdamModule(TwoPartModule):
    """One Adam over everything at its own ``lr`` argument: train.body / train.head's lr never reaches it."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int, lr: float = 0.01):
        super().__init__(num_classes, in_channels, image_size)
        self.save_hyperparameters()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class ScheduledModule(TwoPartModule):
    """Lightning's dict form with an epoch scheduler: the lr halves after each local epoch."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                                   "interval": "epoch"}}


class ManualEverything(TwoPartModule):
    """Manual optimization that steps every optimizer it has, whatever the method trains; Adam for the head."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def configure_optimizers(self):
        return [torch.optim.SGD(self.body.parameters(), lr=0.1, momentum=0.9),
                torch.optim.Adam(self.head.parameters(), lr=0.01)]

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        for opt in self.optimizers():
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in self.optimizers():
            opt.step()


class HeadWriter(ManualEverything):
    """Moves its head by hand, around the optimizers."""

    def training_step(self, batch, batch_idx):
        super().training_step(batch, batch_idx)
        with torch.no_grad():
            self.head.bias.add_(0.01)


class ForgetsBackward(ManualEverything):
    """Manual optimization that never calls manual_backward: nothing would train."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


class Broken(TwoPartModule):
    def training_step(self, batch, batch_idx):
        raise ValueError("boom in the user's training_step")


class BrokenUnderWay(TwoPartModule):
    """Trains in the driver's rehearsal (before Ray starts), raises in a worker: a module error once the run is
    under way, after its folder is written."""

    def training_step(self, batch, batch_idx):
        import ray

        if ray.is_initialized():
            raise ValueError("boom in a worker")
        return super().training_step(batch, batch_idx)


class NeedsWidth(pl.LightningModule):
    """A plain module whose __init__ takes an argument fedsim cannot guess."""

    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x.flatten(1))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)  # optimizers: fedsim's, from train.body / train.head


class NotLightning(nn.Module):
    pass


class TwoOptimizersAutomatic(ManualEverything):
    """Two optimizers under automatic optimization: Lightning refuses that."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = True


class HeadFirstOptimizers(ManualEverything):
    """Its head's optimizer comes first: fedsim must not match optimizers to parts by position."""

    def configure_optimizers(self):
        return [torch.optim.Adam(self.head.parameters(), lr=0.003), torch.optim.SGD(self.body.parameters(), lr=0.3)]


class SetupFails(pl.Callback):
    """A callback whose setup raises what no fedsim check foresees."""

    def setup(self, trainer, pl_module, stage):
        raise RuntimeError("no licence for this callback")


class CallbackRow(Sequence):
    """A Sequence that is neither a list nor a tuple, as configure_callbacks may return."""

    def __init__(self, *callbacks):
        self.callbacks = callbacks

    def __getitem__(self, index):
        return self.callbacks[index]

    def __len__(self):
        return len(self.callbacks)


class RowOfCallbacks(TwoPartModule):
    def configure_callbacks(self):
        return CallbackRow(CountingCallback(), ListedCallback("row"))


class DictWithoutLoss(TwoPartModule):
    def training_step(self, batch, batch_idx):
        return {"out": super().training_step(batch, batch_idx)}


class LogsAcc(TwoPartModule):
    """Logs a name fedsim's own records use."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("acc", 0.5)
        return loss


class CountsWhatItScores(TwoPartModule):
    """validation_step and test_step each count the samples they see (and their hooks the passes), as a Lightning
    user's module tells its validation data from its test data."""

    def validation_step(self, batch, batch_idx):
        self.log("validation_samples", float(len(batch[1])), reduce_fx="sum")

    def test_step(self, batch, batch_idx):
        self.log("test_samples", float(len(batch[1])), reduce_fx="sum")

    def on_validation_start(self):
        CALLS["on_validation_start"] += 1

    def on_test_start(self):
        CALLS["on_test_start"] += 1


def tiny_char_lstm(num_classes: int, in_channels: int, image_size) -> SplitNet:
    """LEAF's character LSTM at a test's size (embedding 4, two layers of 16)."""
    from fedsim.models.text import char_lstm

    return char_lstm(num_classes, in_channels, image_size, embedding=4, hidden=16)


class TokenMean(nn.Module):
    """(B, 1, 1, T) float token ids -> the mean of their embeddings, padding (id 0) left out."""

    def __init__(self, vocabulary: int, width: int):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocabulary, width, mode="mean", padding_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding(x.flatten(1).round().long())


def tiny_token_bag(num_classes: int, in_channels: int, image_size) -> SplitNet:
    """A test-sized model of MiniLM's token ids (shakespeare_speakers): their mean embedding of 8, one hidden layer."""
    return SplitNet(TokenMean(30522, 8), [nn.Sequential(nn.Linear(8, 8), nn.ReLU())], nn.Linear(8, num_classes))


def tiny_char_transformer(num_classes: int, in_channels: int, image_size) -> SplitNet:
    """The causal character transformer at a test's size (width 16, two heads, two layers)."""
    from fedsim.models.text import char_transformer

    return char_transformer(num_classes, in_channels, image_size, width=16, heads=2)


class StopsInADebugger(TwoPartModule):
    """A user debugging their training_step: ``breakpoint()`` calls ``sys.breakpointhook``, which a test replaces."""

    def training_step(self, batch, batch_idx):
        breakpoint()
        return super().training_step(batch, batch_idx)


def token_sequences(root, options) -> ArrayDataset:
    """A few short token-id sequences per client for minilm (float32 ids, exact below 2**24; padding id 0 at the tails): class c draws its words
    from a range of its own, and client g holds classes g and g + 1, so clients' label sets overlap only in part."""
    from fedsim.data.array_dataset import content_digest

    clients, classes, length = options.get("clients", 3), 4, options.get("length", 12)
    rng = np.random.default_rng(0)

    def split(per_client: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        groups = np.repeat(np.arange(clients), per_client)
        labels = (groups + rng.integers(0, 2, len(groups))) % classes
        ids = 2000 + 50 * labels[:, None] + rng.integers(0, 50, (len(groups), length))
        ids[:, 0] = 101  # [CLS]
        ends = rng.integers(length // 2, length + 1, len(groups))
        ids[np.arange(length)[None, :] >= ends[:, None]] = 0  # [PAD]
        return ids.astype(np.float32).reshape(-1, 1, length, 1), labels.astype(np.int64), groups.astype(np.int64)

    train_x, train_y, train_g = split(options.get("train_per_client", 8))
    test_x, test_y, test_g = split(options.get("test_per_client", 4))
    return ArrayDataset("tokens", train_x, train_y, test_x, test_y, tuple(f"c{c}" for c in range(classes)),
                        (0.0,), (1.0,), train_g, test_g, augmentable=False,
                        digest=content_digest(train_x, train_y, test_x, test_y))
