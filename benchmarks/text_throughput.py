"""Samples/s of LEAF's character LSTM per core: fedsim's client training step against a bare PyTorch loop on the same
Shakespeare windows (issue 69, item 5; target: fedsim / bare >= 0.9).

fedsim: one worker core (ClientRuntime.train_and_sum, as a Ray worker runs a client: load the global weights, the
client's windows out of the memory-mapped cache, the Lightning module through Fabric, pack the upload, the exact
sum); bare: an nn.Embedding / 2-layer nn.LSTM / nn.Linear on int64 indices and one SGD, the windows converted once.
Same windows, same order (the client's generator), same batch size (LEAF's 10), each rep from the same global weights,
1 thread, in one process, repetitions interleaved (the order alternating), medians of CPU seconds. After the timed reps a same-work check trains both from the same
weights for a round and prints their largest weight difference.

    .venv/bin/python benchmarks/text_throughput.py [--windows 1000] [--reps 3]
    .venv/bin/python benchmarks/text_throughput.py --smoke     # a tiny LSTM, 20 windows, one rep: seconds
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from _common import CpuMeter, fixed_point_scales, log, machine, median, parse, save, worker_runtime
from fedsim.algorithms import WEIGHTS  # after _common, which sets the environment fedsim reads
from fedsim.client.randomness import client_generator
from fedsim.config import validate
from fedsim.core.protocol import ClientData
from fedsim.data import load_dataset

HAMLET = {"plays": ["hamlet"], "min_chars": 9000}  # Hamlet's four longest parts: a parse of one play
LR = 0.8  # LEAF's Shakespeare learning rate


def tree(batch: int, hidden: int) -> dict:
    return {"name": "bench-text", "seed": 0, "algorithm": "fedavg", "out_dir": "/tmp/fedsim-bench-runs",
            "data": {"dataset": "shakespeare", "partition": "natural", "num_clients": 4, "options": HAMLET,
                     "augment": False},
            "model": {"name": "char_lstm", "personal_layers": 1, "options": {"hidden": hidden}},
            "train": {"rounds": 1, "local_epochs": 1, "batch_size": batch,
                      "body": {"lr": LR, "momentum": 0.0}, "head": {"lr": LR, "momentum": 0.0}},
            "eval": {"finetune_epochs": 0}, "engine": {"workers": 1, "threads_per_worker": 1}}


class BareLSTM(nn.Module):
    """LEAF's stacked_lstm.py in plain PyTorch: what a user without fedsim writes."""

    def __init__(self, vocabulary: int, embedding: int, hidden: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=2, batch_first=True)
        self.output = nn.Linear(hidden, vocabulary)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(codes))
        return self.output(out[:, -1])

    def load_from(self, net: nn.Module) -> None:
        """fedsim's char_lstm weights (its two one-layer LSTMs are this LSTM's layers 0 and 1)."""
        p = dict(net.named_parameters())
        mine = {"embedding.weight": p["stem.1.weight"], "output.weight": p["classifier.weight"],
                "output.bias": p["classifier.bias"]}
        for layer in (0, 1):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                mine[f"lstm.{name}_l{layer}"] = p[f"blocks.{layer}.lstm.{name}_l0"]
        self.load_state_dict({k: v.detach().clone() for k, v in mine.items()})


def bare_client(model: BareLSTM, start: dict[str, torch.Tensor], windows: np.ndarray, labels: np.ndarray,
                batch: int, generator: torch.Generator) -> None:
    """A client's epoch in plain PyTorch: from the global weights ``start`` (as fedsim's client starts from the
    broadcast, so both do the same work each rep), plain SGD over the windows in the order ``generator`` draws."""
    model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.from_numpy(np.ascontiguousarray(windows).reshape(len(windows), -1).astype(np.int64))
    y = torch.from_numpy(np.asarray(labels))
    order = torch.randperm(len(y), generator=generator)
    for first in range(0, len(y), batch):
        idx = order[first:first + batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=1000, help="training windows of the one client")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=10, help="LEAF's batch size")
    ap.add_argument("--hidden", type=int, default=256, help="LSTM width (LEAF's 256)")
    args = parse(ap, windows=20, reps=1, hidden=16)
    torch.set_num_threads(1)
    cfg = validate(tree(args.batch, args.hidden))
    data = load_dataset("shakespeare", options=HAMLET)  # the cache's memory map, as the worker sees it
    idx = np.flatnonzero(data.train_groups == 0)[:args.windows]
    rt = worker_runtime(cfg, {0: ClientData(idx, np.flatnonzero(data.test_groups == 0)[:10])})
    broadcast = {WEIGHTS: rt.plan.model.initial["shared"]}
    scales = fixed_point_scales(rt, len(idx))
    windows, labels = np.asarray(data.train_x[idx]), np.asarray(data.train_y[idx])
    bare = BareLSTM(data.num_classes, 8, args.hidden)
    bare.load_from(rt.net)  # before any training: the plan's round-0 weights, what the broadcast holds
    start = {k: v.clone() for k, v in bare.state_dict().items()}

    def bare_round(round_idx: int) -> None:
        bare_client(bare, start, windows, labels, args.batch, client_generator(cfg.seed, round_idx, 0))

    cases = {"fedsim": lambda r: rt.train_and_sum(broadcast, [0], r, scales), "bare": bare_round}
    # CPU seconds of this process (one thread trains) are what a core gives: on a shared machine the wall clock
    # also counts the time other processes held the core, which differs from rep to rep.
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    wall: dict[str, list[float]] = {name: [] for name in cases}
    others: list[float] = []
    for rep in range(args.reps + 1):  # rep 0 warms both up and is dropped
        for name, fn in (list(cases.items()) if rep % 2 else list(cases.items())[::-1]):  # order alternates
            with CpuMeter(interval=0.5) as meter:
                t, c = time.perf_counter(), time.process_time()
                fn(rep + 1)
                seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - c
            if rep:
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
                others.append(meter.others_cores)
    rate = {name: len(idx) / median(ts) for name, ts in cpu.items()}
    wall_rate = {name: len(idx) / median(ts) for name, ts in wall.items()}
    difference = same_work(rt, broadcast, scales, bare_round, bare)
    ratio = rate["fedsim"] / rate["bare"]
    print(f"char LSTM (hidden {args.hidden}), one client of {len(idx)} windows of 80, batch {args.batch}, 1 thread, "
          f"medians of {args.reps} interleaved reps; other processes kept {median(others):.2f} cores busy (median)")
    for name, title in (("fedsim", "fedsim client training step"), ("bare", "bare PyTorch loop")):
        print(f"  {title:<28} {rate[name]:8.1f} samples per CPU second ({wall_rate[name]:.1f} per wall second)")
    print(f"  same work: largest weight difference after one epoch {difference:.2e}")
    print(f"RATIO fedsim / bare samples/s per core: {ratio:.3f} (target >= 0.9); on the wall clock "
          f"{wall_rate['fedsim'] / wall_rate['bare']:.3f}")
    save("text_throughput", {"machine": machine(), "args": vars(args), "cpu_seconds": cpu, "wall_seconds": wall,
                             "others_cores": others, "samples_per_cpu_s": rate, "samples_per_wall_s": wall_rate,
                             "ratio": ratio, "max_weight_difference": difference})


def same_work(rt, broadcast, scales, bare_round, bare: BareLSTM) -> float:
    """Both trained one epoch of a round from the round's global weights: the largest difference of any weight."""
    round_idx = 10 ** 6  # a round the timed reps never used
    rt.train_and_sum(broadcast, [0], round_idx, scales)
    bare_round(round_idx)
    fedsim_trained = BareLSTM(bare.output.out_features, bare.embedding.embedding_dim, bare.lstm.hidden_size)
    fedsim_trained.load_from(rt.net)
    mine, theirs = dict(bare.named_parameters()), dict(fedsim_trained.named_parameters())
    return max(float((mine[k] - theirs[k]).detach().abs().max()) for k in mine)


if __name__ == "__main__":
    log("text_throughput: building the worker core (the first run parses the tarball into the cache)")
    main()
