"""Where a worker's compute goes, and what channels_last would save: the cnn4 training step and
evaluation forward, 1 torch thread, plain PyTorch (no fedsim engine), NCHW (what fedsim runs today)
vs torch.channels_last, interleaved repetitions.

py-spy on fedsim's workers (profile_workers.py) puts ~95% of their time in training_step, with
MaxPool2d's forward alone at ~21-24%: on CPU, NCHW max-pooling and convolution are slow paths.

    .venv/bin/python benchmarks/profile_compute.py [--reps 5]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from _common import median


def step_time(channels_last: bool, batch: int, train: bool, steps: int) -> float:
    from fedsim.models import build_model

    torch.manual_seed(0)
    net = build_model("cnn4", 10, (3, 32, 32))
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    net.train(train)

    def one() -> None:
        if train:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        else:
            with torch.no_grad():
                net(x)

    for _ in range(3):
        one()
    t = time.perf_counter()
    for _ in range(steps):
        one()
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = [("train step, batch 50", 50, True, 20), ("train step, batch 5", 5, True, 60),
             ("eval forward, batch 500", 500, False, 5)]
    print("cnn4, 1 thread, ms per call (median of interleaved reps)")
    print(f"  {'':26}{'NCHW':>8}{'channels_last':>15}{'speed-up':>10}")
    for label, batch, train, steps in cases:
        t = {False: [], True: []}
        for _ in range(args.reps):
            for cl in (False, True):
                t[cl].append(step_time(cl, batch, train, steps))
        a, b = median(t[False]), median(t[True])
        print(f"  {label:26}{1000 * a:>8.1f}{1000 * b:>15.1f}{a / b:>10.2f}")


if __name__ == "__main__":
    main()
