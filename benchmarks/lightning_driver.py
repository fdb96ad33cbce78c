"""Which Lightning driving mode for the workers: a plain loop vs fedsim's loop (Fabric, the default) vs
fedsim's opt-in `model.client_loop: trainer` (a pl.Trainer fit per local update), on fedsim's own FedClient
(cnn4, two optimizers, manual optimization). Many short client fits are fedsim's workload, so what matters
is the fixed cost per client. Prints per-client time ratios against the plain loop, measured in one process.

    .venv/bin/python benchmarks/lightning_driver.py [--clients 20] [--steps 10] [--repeats 5]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings

import torch

from fedsim.client.fabric import FedsimFabric
from fedsim.client.loop import LocalLoop
from fedsim.client.optimizers import OptimizerSet
from fedsim.config import ModelConfig, OptimConfig
from fedsim.models import build_model
from fedsim.models.lightning import FedClient, module_optimizers, optimizer_parts, part_parameters, split_keys

from _common import parse

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning_fabric").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
PARTS = frozenset({"body", "head"})


def make_client() -> tuple[FedClient, object]:
    torch.manual_seed(0)
    module = FedClient(build_model("cnn4", 10, (3, 32, 32)))
    keys = split_keys(module, ModelConfig())
    settings = {"body": OptimConfig(), "head": OptimConfig()}
    return module, keys, module_optimizers(module, part_parameters(module, keys), settings)


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(50, 3, 32, 32, generator=g), torch.randint(0, 10, (50,), generator=g)) for _ in range(steps)]


def plain(clients: int, data) -> None:
    """No Lightning: the module's step logic by hand (the floor)."""
    module, _, made = make_client()
    opts = made.optimizers
    for _ in range(clients):
        for o in opts:
            o.state.clear()
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(module(x), y)
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss.backward()
            for o in opts:
                o.step()


def fedsim_loop(clients: int, data, with_trainer: bool = False) -> None:
    """fedsim's LocalLoop as a worker runs it: one local update (a Lightning fit) per client."""
    module, keys, made = make_client()
    fabric = FedsimFabric(accelerator="cpu", devices=1)
    _, *wrapped = fabric.setup(module, *made.optimizers)
    train = OptimizerSet(made.optimizers, [], wrapped, optimizer_parts(made.optimizers, module, keys))
    loop = LocalLoop(module, fabric, {"train": train, "finetune": train}, keys, [], 10, [], with_trainer=with_trainer)
    settings = [[{} for _ in o.param_groups] for o in made.optimizers]
    for _ in range(clients):
        loop.fit(lambda: iter(data), 1, PARTS, settings)


MODES = {"plain loop": plain, "fedsim (Fabric)": fedsim_loop,
         "fedsim client_loop=trainer": lambda clients, data: fedsim_loop(clients, data, with_trainer=True)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parse(parser, clients=2, steps=1, repeats=1)
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
