"""Which Lightning driving mode for the workers: Trainer vs Fabric vs a plain loop, on fedsim's own
FedClient (cnn4, two optimizers, manual optimization). Many short client fits are fedsim's workload,
so what matters is the fixed cost per client. Prints per-client time ratios against the plain loop.

    .venv/bin/python benchmarks/lightning_driver.py [--clients 20] [--steps 10] [--repeats 5]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings

import pytorch_lightning as pl
import torch
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

from fedsim.client import FedClient
from fedsim.config import OptimConfig
from fedsim.models import build_model

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning_fabric").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


def make_client() -> FedClient:
    torch.manual_seed(0)
    net = build_model("cnn4", 10, (3, 32, 32))
    _, head = net.split_keys(1)
    return FedClient(net, head, 10, OptimConfig(), OptimConfig())


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(50, 3, 32, 32, generator=g), torch.randint(0, 10, (50,), generator=g)) for _ in range(steps)]


def plain(clients: int, data) -> None:
    """No Lightning: the module's step logic by hand (the floor)."""
    module = make_client()
    opts = module.configure_optimizers()
    for _ in range(clients):
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(module(x), y)
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()


def fabric_mode(clients: int, data) -> None:
    """fedsim's choice: Fabric set up once per worker, the module's training_step per batch."""
    module = make_client()
    raw = module.configure_optimizers()
    fabric = Fabric(accelerator="cpu", devices=1)
    wrapped, *_ = fabric.setup(module, *raw)
    for _ in range(clients):
        for o in raw:
            o.state.clear()
        for i, batch in enumerate(data):
            wrapped.training_step(batch, i)


def trainer_per_client(clients: int, data) -> None:
    """A new Trainer + fit for every client (the obvious Lightning way)."""
    module = make_client()
    loader = DataLoader(TensorDataset(torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])), batch_size=50)
    for _ in range(clients):
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, loader)


MODES = {"plain loop": plain, "fabric (fedsim)": fabric_mode, "trainer per client": trainer_per_client}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = batches(args.steps)
    times = {name: [] for name in MODES}
    for _ in range(args.repeats):  # interleaved, medians: the machine is noisy
        for name, fn in MODES.items():
            start = time.perf_counter()
            fn(args.clients, data)
            times[name].append(time.perf_counter() - start)
    floor = statistics.median(times["plain loop"])
    print(f"{args.clients} clients x {args.steps} steps (cnn4, batch 50, 1 thread), median of {args.repeats}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<20} ratio to plain {med / floor:5.3f}   extra per client {1000 * (med - floor) / args.clients:7.2f} ms")


if __name__ == "__main__":
    main()
