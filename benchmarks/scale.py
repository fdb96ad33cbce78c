"""FedPer with 100, 1,000 and 10,000 virtual clients: seconds per round and memory per client.

Workload: the quickstart's FedPer (cnn4, K_P = 1, e = 4, b = 50, SGD 0.01/0.9/5e-4, augmentation),
CIFAR-10 iid with the same small data at every N: --samples-per-client train images (default 5;
train_fraction = N x 5 / 50,000) and 1 test image each (test_fraction = N / 10,000); fraction f of
the clients trains each round: 10% up to N = 1,000, then 100 / N (1% at 10,000), so that N = 1,000
and N = 10,000 both train 100 clients per round and their memory differs only by N; every client
is evaluated once, in the last round. 2 workers x 1 thread.

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
and the marginal cost per client is compared with that. Two parts are measured separately:
  registered client: slope of the workers' peak RssAnon between the two runs with equal clients
    per round (N = 1,000 and 10,000): what holding one more client costs before it trains;
  trained client: the growth of one worker core's RssAnon (ClientRuntime in a fresh process, no
    Ray: `benchmarks/profiling.py memory`) while --trained more clients train once each.
Their sum is the marginal memory per client in a long run where every client has trained.

    .venv/bin/python benchmarks/scale.py                    # N = 100, 1000, 10000; 3 rounds: ~3 min
    .venv/bin/python benchmarks/scale.py --clients 100 1000 --rounds 2 --fraction 0.05 --trained 0
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from _common import MemorySampler, log, machine, measured, parse, quickstart, run_fedsim, save
from profiling import memory_child

CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000


def personal_bytes(tree: dict) -> int:
    """Bytes of one client's personal vector: float32 over the runtime's own personal layout."""
    from fedsim.algorithms import build_algorithm
    from fedsim.config import validate
    from fedsim.plan.build import build_model_plan

    cfg = validate(tree)
    return 4 * build_model_plan(cfg, build_algorithm(cfg), 10, (3, 32, 32)).layouts["personal"].size


def fraction_for(n: int, args) -> float:
    return args.fraction if args.fraction else (0.1 if n <= 1000 else 100 / n)


def one(n: int, args) -> dict:
    from fedsim.plan import sample_clients

    f = fraction_for(n, args)
    tree = quickstart({
        "name": f"bench-scale-{n}", "data.partition": "iid", "data.num_clients": n,
        "data.train_fraction": min(1.0, n * args.samples_per_client / CIFAR_TRAIN),
        "data.test_fraction": min(1.0, n / CIFAR_TEST),
        "train.rounds": args.rounds, "train.fraction": f, "train.eval_every": args.rounds + 1,
    })
    with MemorySampler() as mem:
        r = measured(run_fedsim, tree)
    workers = {w["pid"] for w in r["summary"]["workers"]}
    procs = mem.stats
    r["worker_mem"] = [procs[p] for p in workers if p in procs]
    server = [s for s in procs.values() if s["cmd"].startswith("ray::Server")]
    r["server_mem"] = server[0] if server else {}
    r["entrypoint_mem"] = procs.get(os.getpid(), {})
    # What the workers hold by design: index bytes of every client, personal vectors of trained clients.
    part = np.load(os.path.join(r["run_dir"], "partition.npz"))
    r["index_bytes"] = int(sum(part[k].nbytes for k in part.files))
    trained = set()
    for rnd in range(1, args.rounds + 1):
        trained.update(sample_clients(tree["seed"], rnd, n, f))
    r["trained_clients"] = len(trained)
    r["personal_bytes_each"] = personal_bytes(tree)
    r["expected_bytes"] = r["index_bytes"] + len(trained) * r["personal_bytes_each"]
    r["sampled_per_round"] = max(1, round(f * n))
    r["fraction"] = f
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fraction", type=float, default=None, help="default: 0.1 up to N = 1000, then 100 / N")
    ap.add_argument("--trained", type=int, default=1000, help="clients trained in the in-process personal-state "
                    "measurement (0 = skip it)")
    ap.add_argument("--samples-per-client", type=int, default=5)
    args = parse(ap, clients=[20, 40], rounds=2, trained=10)

    results = []
    for n in args.clients:
        results.append(one(n, args))
        r = results[-1]
        log(f"  N={n}: {r['end_to_end_s']:.1f} s end to end, rounds {[round(s, 2) for s in r['round_s']]}, "
            f"others busy {r['others_cores']:.2f} cores")

    print(f"\nFedPer scale, {args.samples_per_client} train + 1 test images per client, {args.rounds} rounds, "
          f"2 workers x 1 thread, every client evaluated in the last round")
    print(f"{'N':>7}{'f':>7}{'sampled':>9}{'s/round':>9}{'ms/client':>11}{'eval s':>8}{'e2e s':>8}"
          f"{'server peak MB':>16}{'entry anon MB':>15}{'worker peak MB':>16}{'worker anon MB':>16}{'trained':>9}")
    for n, r in zip(args.clients, results):
        train_rounds = r["round_s"][:-1] or r["round_s"]
        per_round = float(np.median(train_rounds))
        ev = r["round_s"][-1] - per_round if len(r["round_s"]) > 1 else float("nan")
        w_hwm = sum(w["peak_hwm_kb"] for w in r["worker_mem"]) / 1024
        w_anon = sum(w["peak_anon_kb"] for w in r["worker_mem"]) / 1024
        d_hwm = r["server_mem"].get("peak_hwm_kb", 0) / 1024
        e_anon = r["entrypoint_mem"].get("peak_anon_kb", 0) / 1024
        print(f"{n:>7}{r['fraction']:>7.3f}{r['sampled_per_round']:>9}{per_round:>9.2f}"
              f"{1000 * per_round / r['sampled_per_round']:>11.1f}{ev:>8.1f}{r['end_to_end_s']:>8.1f}{d_hwm:>16.0f}"
              f"{e_anon:>15.0f}{w_hwm:>16.0f}{w_anon:>16.0f}{r['trained_clients']:>9}")
    print("(s/round: server clock, median of the training-only rounds; ms/client = s/round / sampled;\n"
          " worker columns: sum over the 2 workers; peak = VmHWM (incl. file pages), anon = peak RssAnon)")
    out = {}
    same = {}
    for n, r in zip(args.clients, results):
        same.setdefault(r["sampled_per_round"], []).append((n, r))
    pairs = max(same.values(), key=len)
    pb = results[-1]["personal_bytes_each"]
    if len(pairs) >= 2:
        (n0, r0), (n1, r1) = pairs[0], pairs[-1]
        anon = lambda r: sum(w["peak_anon_kb"] for w in r["worker_mem"]) * 1024  # noqa: E731
        reg = (anon(r1) - anon(r0)) / (n1 - n0)
        idx = (r1["index_bytes"] - r0["index_bytes"]) / (n1 - n0)
        extra_trained = (r1["trained_clients"] - r0["trained_clients"]) / (n1 - n0)
        out.update(registered_b=reg, index_b=idx, extra_trained_per_client=extra_trained)
        print(f"\nregistered client (N = {n0} -> {n1}, {r0['sampled_per_round']} clients per round in both): "
              f"{reg:,.0f} B of worker RssAnon per client; its index data {idx:,.0f} B "
              f"({extra_trained:.3f} more trained clients per client: {extra_trained * pb:,.0f} B of personal vectors)")
    if args.trained:
        prof = memory_child(max(args.clients), args.trained)
        if prof:
            st = list(prof["stages"].values())
            per_trained = (st[-1]["anon_kb"] - st[-2]["anon_kb"]) * 1024 / args.trained
            out["trained_b"] = per_trained
            print(f"trained client (worker core, {args.trained} more clients train once, 50 per train call): "
                  f"{per_trained:,.0f} B of "
                  f"RssAnon per client; its personal vector {pb:,} B (FedPer K_P = 1: classifier 10 x 256 + 10)")
    if "registered_b" in out and "trained_b" in out:
        marginal = out["registered_b"] - out["extra_trained_per_client"] * pb + out["trained_b"]
        design = pb + out["index_b"]
        out.update(marginal_b=marginal, design_b=design)
        print(f"marginal per client once trained: {marginal:,.0f} B  vs  personal + data bytes {design:,.0f} B")
        print(f"RATIO marginal / (personal + data bytes): {marginal / design:.2f}   target <= 1.2")
    results_summary = out
    path = save("scale", {"args": vars(args), "machine": machine(), "results": results, "summary": results_summary})
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
