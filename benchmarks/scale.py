"""FedPer with 100, 1,000 and 10,000 virtual clients: seconds per round and memory per client.

Workload: the quickstart's FedPer (cnn4, K_P = 1, e = 4, b = 50, SGD 0.01/0.9/5e-4, augmentation),
CIFAR-10 iid with the same small data at every N: --samples-per-client train images (default 5;
train_fraction = N x 5 / 50,000) and 1 test image each (test_fraction = N / 10,000); fraction f of
the clients trains each round (default 10%); every client is evaluated once, in the last round.
2 workers x 1 thread.

Memory: a sampler polls /proc/<pid>/status of every process in this process tree (Ray's raylet and
its workers descend from the process that called ray.init) and keeps each one's peak VmHWM (peak
RSS) and peak RssAnon. The slope uses RssAnon, not VmRSS: RSS also counts file-backed pages, and a
worker's RSS grows with the share of the memory-mapped CIFAR-10 cache its clients touched (up to
150 MB at N = 10,000), which is page cache shared by every process, not per-client memory.

What a client costs, by design: its data is NOT pixels but indices into the shared memory map
(train + test int64 indices: 8 x (n_train + n_test) bytes), and, once it has trained, its personal
layers as one float32 vector (FedPer K_P = 1: the classifier, 2,570 floats = 10,280 bytes). Clients
that have never trained hold no personal vector (they use the initial head). So the expected worker
bytes at N are  sum_j 8 (n_train_j + n_test_j) + (#clients trained so far) x personal bytes,
and the marginal cost per client is compared with the slope of that expectation in N.

    .venv/bin/python benchmarks/scale.py                    # N = 100, 1000, 10000; 3 rounds: ~4 min
    .venv/bin/python benchmarks/scale.py --clients 100 1000 --rounds 2 --fraction 0.05
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from _common import MemorySampler, log, machine, measured, quickstart, run_fedsim, save
from overhead import sampled_clients

CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000


def personal_bytes(tree: dict) -> int:
    import torch

    from fedsim.models import build_model

    torch.manual_seed(0)
    net = build_model(tree["model"]["name"], 10, (3, 32, 32))
    _, head = net.split_keys(tree["model"]["personal_layers"])
    state = net.state_dict()
    return 4 * sum(state[k].numel() for k in head)  # float32 vector, as the worker keeps it


def slope(xs, ys) -> float:
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def one(n: int, args) -> dict:
    tree = quickstart({
        "name": f"bench-scale-{n}", "data.partition": "iid", "data.num_clients": n,
        "data.train_fraction": min(1.0, n * args.samples_per_client / CIFAR_TRAIN),
        "data.test_fraction": min(1.0, n / CIFAR_TEST),
        "train.rounds": args.rounds, "train.fraction": args.fraction, "train.eval_every": args.rounds + 1,
    })
    with MemorySampler() as mem:
        r = measured(run_fedsim, tree)
    workers = {w["pid"] for w in r["summary"]["workers"]}
    procs = mem.stats
    r["worker_mem"] = [procs[p] for p in workers if p in procs]
    driver = [s for p, s in procs.items() if "Driver" in s["cmd"]]
    r["driver_mem"] = driver[0] if driver else {}
    r["entrypoint_mem"] = procs.get(os.getpid(), {})
    # What the workers hold by design: index bytes of every client, personal vectors of trained clients.
    part = np.load(os.path.join(r["run_dir"], "partition.npz"))
    r["index_bytes"] = int(sum(part[k].nbytes for k in part.files))
    trained = set()
    for rnd in range(1, args.rounds + 1):
        trained.update(sampled_clients(tree["seed"], rnd, n, args.fraction))
    r["trained_clients"] = len(trained)
    r["personal_bytes_each"] = personal_bytes(tree)
    r["expected_bytes"] = r["index_bytes"] + len(trained) * r["personal_bytes_each"]
    r["sampled_per_round"] = max(1, round(args.fraction * n))
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--samples-per-client", type=int, default=5)
    args = ap.parse_args()

    results = []
    for n in args.clients:
        results.append(one(n, args))
        r = results[-1]
        log(f"  N={n}: {r['end_to_end_s']:.1f} s end to end, rounds {[round(s, 2) for s in r['round_s']]}, "
            f"others busy {r['others_cores']:.2f} cores")

    print(f"\nFedPer scale, {args.samples_per_client} train + 1 test images per client, f = {args.fraction}, "
          f"{args.rounds} rounds, 2 workers x 1 thread")
    print(f"{'N':>7}{'sampled':>9}{'s/round':>9}{'ms/client':>11}{'eval s':>8}{'e2e s':>8}"
          f"{'driver peak MB':>16}{'entry anon MB':>15}{'worker peak MB':>16}{'worker anon MB':>16}{'trained':>9}")
    xs, anon, expected = [], [], []
    for n, r in zip(args.clients, results):
        train_rounds = r["round_s"][:-1] or r["round_s"]
        per_round = float(np.median(train_rounds))
        ev = r["round_s"][-1] - per_round if len(r["round_s"]) > 1 else float("nan")
        w_hwm = sum(w["peak_hwm_kb"] for w in r["worker_mem"]) / 1024
        w_anon = sum(w["peak_anon_kb"] for w in r["worker_mem"]) / 1024
        d_hwm = r["driver_mem"].get("peak_hwm_kb", 0) / 1024
        e_anon = r["entrypoint_mem"].get("peak_anon_kb", 0) / 1024
        print(f"{n:>7}{r['sampled_per_round']:>9}{per_round:>9.2f}{1000 * per_round / r['sampled_per_round']:>11.1f}"
              f"{ev:>8.1f}{r['end_to_end_s']:>8.1f}{d_hwm:>16.0f}{e_anon:>15.0f}{w_hwm:>16.0f}{w_anon:>16.0f}"
              f"{r['trained_clients']:>9}")
        xs.append(n)
        anon.append(sum(w["peak_anon_kb"] for w in r["worker_mem"]) * 1024)
        expected.append(r["expected_bytes"])
    print("(worker columns: sum over the 2 workers; peak = VmHWM, anon = peak RssAnon)")
    if len(xs) >= 2:
        measured_slope, expected_slope = slope(xs, anon), slope(xs, expected)
        pb = results[-1]["personal_bytes_each"]
        print(f"marginal worker memory per client (slope of anon RSS vs N): {measured_slope:,.0f} B")
        print(f"by design per client (slope of index bytes + trained x {pb:,} B personal): {expected_slope:,.0f} B")
        print(f"RATIO marginal / (personal + data bytes): {measured_slope / expected_slope:.2f}   target <= 1.2")
    path = save("scale", {"args": vars(args), "machine": machine(), "results": results})
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
