"""Per-client training cost of fedsim's worker core vs a plain PyTorch loop, in one process, 1 thread.

  engine      fedsim.engine.worker.ClientRuntime.train([client]) - what a Ray worker runs per client:
              load weights, Lightning module via Fabric (training_step, manual_backward, 2 optimizers),
              pack personal + shared vectors; engine.memory_format=auto (channels_last on CPU)
  engine-nchw the same with engine.memory_format=contiguous
  plain       the same SGD steps written directly, NCHW (what overhead.py's bare loop and the Flower
              client do)

Interleaved repetitions; engine-nchw / plain is the worker core's own overhead, without Ray;
engine / engine-nchw is what the memory format buys.
Default: one cross-silo client (5,000 CIFAR-10 images, e = 1, b = 50, FedAvg, augmentation on).

    .venv/bin/python benchmarks/profile_step.py [--samples 5000] [--epochs 1] [--reps 3] [--algorithm fedavg]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from _common import median, quickstart


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--algorithm", default="fedavg")
    args = ap.parse_args()

    from fedsim.config import validate
    from fedsim.data import load_dataset, random_crop_flip, to_float
    from fedsim.engine.worker import ClientData, ClientRuntime, client_generator, shared_layout
    from fedsim.models import build_model

    torch.set_num_threads(1)
    tree = quickstart({"algorithm": args.algorithm, "data.partition": "iid", "train.local_epochs": args.epochs})
    cfg = validate(tree)
    data = load_dataset("cifar10")
    idx = np.sort(np.random.default_rng(0).choice(len(data.train_y), args.samples, replace=False))
    test = np.arange(100)
    runtimes = {fmt: ClientRuntime(validate({**tree, "engine": {**tree["engine"], "memory_format": fmt}}).model_dump(),
                                   {0: ClientData(idx, test)}) for fmt in ("auto", "contiguous")}
    _, shared = shared_layout(cfg, data.num_classes, data.input_shape)

    torch.manual_seed(0)
    net = build_model("cnn4", data.num_classes, data.input_shape)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def plain(round_idx: int) -> None:
        x = to_float(data.train_x[idx], data.mean, data.std)
        y = torch.as_tensor(data.train_y[idx])
        opt.state.clear()
        net.train()
        gen = client_generator(0, round_idx, 0)
        for _ in range(args.epochs):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), 50):
                b = order[start:start + 50]
                loss = F.cross_entropy(net(random_crop_flip(x[b], gen)), y[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    times: dict[str, list[float]] = {"engine": [], "engine-nchw": [], "plain": []}
    for rep in range(args.reps + 1):  # rep 0 warms everything up and is dropped
        for name, fn in (("engine", lambda r: runtimes["auto"].train(shared, [0], r)),
                         ("engine-nchw", lambda r: runtimes["contiguous"].train(shared, [0], r)), ("plain", plain)):
            t = time.perf_counter()
            fn(rep + 1)
            if rep:
                times[name].append(time.perf_counter() - t)
    e, n, p = median(times["engine"]), median(times["engine-nchw"]), median(times["plain"])
    steps = args.epochs * -(-args.samples // 50)
    print(f"one client, {args.samples} images x {args.epochs} epoch(s) = {steps} steps of 50, 1 thread, "
          f"{args.algorithm}; medians of {args.reps} interleaved reps")
    print(f"  engine (ClientRuntime.train), channels_last  {e:7.2f} s  {1000 * e / steps:6.1f} ms/step")
    print(f"  engine, memory_format=contiguous             {n:7.2f} s  {1000 * n / steps:6.1f} ms/step")
    print(f"  plain PyTorch loop, NCHW                     {p:7.2f} s  {1000 * p / steps:6.1f} ms/step")
    print(f"RATIO engine-nchw / plain (worker core overhead): {n / p:.3f}")
    print(f"RATIO engine / plain (what a user gets):          {e / p:.3f}")


if __name__ == "__main__":
    main()
