"""Packed client training (engine.pack): ratios measured in one run, interleaved (A, B, C, A, B, C).

  crossdevice  pfl-research's cross-device CIFAR-10 workload (arXiv 2404.06430, its publications/pfl configs):
               1,000 users x 50 images (iid), cohort 50 per round, 1 local epoch, batch 10; FedAvg, fedsim's cnn4,
               SGD lr 0.01 / momentum 0.9 / wd 5e-4, crop+flip, every client evaluated once at the end, rounds cut
               (--rounds). Three sides: fedsim sequential (engine.pack 1), fedsim packed (--pack), Flower's
               simulation engine (its own venv, benchmarks/peer_flower.py's set-up), 2 workers x 1 thread each.
  quickstart   experiments/quickstart.yaml's FedPer (10 clients, k = 4, e = 4, b = 50), sequential vs packed.
  steps        one worker core in this process: client-steps per second of packed SGD by pack size, next to
               sequential training of the same clients (the numbers engine.pack: auto measures).
  memory       peak resident memory of one worker core training a pack of G clients (a fresh process per G), per
               packed client.
  profile      self CPU time by operator of 50 cross-device clients, sequential and packed (--profile-pack).

    .venv/bin/python benchmarks/packed.py crossdevice --rounds 3 --reps 2   # ~15 min on this 2-core VM
    .venv/bin/python benchmarks/packed.py quickstart --rounds 2 --reps 2     # ~6 min
    .venv/bin/python benchmarks/packed.py steps memory profile               # ~5 min
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _common import REPO, log, machine, measured, median, parse, quickstart, run_fedsim, save
from fedsim.plan import steps_per_epoch
from peer_flower import HP, WORKLOADS, ensure_flower_venv, export, fedsim_side, run_flower

PFL = {"num_clients": 1000, "fraction": 0.05, "rounds": 3}  # cohort 50 of 1,000
PFL_BATCH = 10


def crossdevice(args) -> dict:
    WORKLOADS["pfl"] = {**PFL, "rounds": args.rounds}
    HP["batch_size"] = PFL_BATCH
    ensure_flower_venv()
    spec = export("pfl", WORKLOADS["pfl"])
    sides = {"sequential": lambda: measured(fedsim_side, "pfl", WORKLOADS["pfl"]),
             "packed": lambda: measured(fedsim_side, "pfl", WORKLOADS["pfl"], {"pack": args.pack}),
             "flower": lambda: measured(run_flower, spec)}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for rep in range(args.reps):
        for name, side in sides.items():
            r = side()
            if name != "flower":
                r["train_round_s"] = r["round_s"][:-1][1:] or r["round_s"][:-1]  # not the warm-up, not evaluation
            r.pop("summary", None)
            runs[name].append(r)
            log(f"rep {rep} {name}: end to end {r['end_to_end_s']:.1f} s, training rounds "
                f"{[round(s, 2) for s in r['train_round_s']]}, others busy {r['others_cores']:.2f} cores")
    per_round = {name: median([median(r["train_round_s"]) for r in rs]) for name, rs in runs.items()}
    e2e = {name: median([r["end_to_end_s"] for r in rs]) for name, rs in runs.items()}
    print(f"\ncross-device (pfl-research's workload): 1,000 clients x 50, cohort 50, e = 1, b = 10, {args.rounds} rounds, "
          f"engine.pack {args.pack}; medians of {args.reps}")
    print(f"  {'side':<12}{'s/round':>9}{'end to end s':>14}")
    for name in sides:
        print(f"  {name:<12}{per_round[name]:>9.2f}{e2e[name]:>14.1f}")
    ratios = {"packed_vs_sequential_round": per_round["sequential"] / per_round["packed"],
              "packed_vs_sequential_e2e": e2e["sequential"] / e2e["packed"],
              "flower_vs_packed_e2e": e2e["flower"] / e2e["packed"],
              "flower_vs_sequential_e2e": e2e["flower"] / e2e["sequential"]}
    print("RATIO sequential / packed: per round {packed_vs_sequential_round:.2f}, end to end "
          "{packed_vs_sequential_e2e:.2f} (target >= 2); Flower / fedsim packed end to end {flower_vs_packed_e2e:.2f}, "
          "Flower / fedsim sequential {flower_vs_sequential_e2e:.2f} (target >= 5)".format(**ratios))
    return {"runs": runs, "per_round": per_round, "end_to_end": e2e, "ratios": ratios}


def quickstart_pair(args) -> dict:
    trees = {"sequential": quickstart({"train.rounds": args.rounds}),
             "packed": quickstart({"train.rounds": args.rounds, "engine.pack": args.pack})}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for rep in range(args.reps):
        for name, tree in trees.items():
            r = measured(run_fedsim, tree)
            runs[name].append({k: v for k, v in r.items() if k != "summary"} | {"acc": r["summary"]["per_client_acc"]})
            log(f"rep {rep} {name}: end to end {r['end_to_end_s']:.1f} s, rounds {[round(s, 2) for s in r['round_s']]}")
    per_round = {name: median([median(r["round_s"]) for r in rs]) for name, rs in runs.items()}
    ratio = per_round["sequential"] / per_round["packed"]
    seq, packed = runs["sequential"][0]["acc"], runs["packed"][0]["acc"]
    gap = max(abs(seq[c] - packed[c]) for c in seq)
    print(f"\nquickstart FedPer, {args.rounds} rounds: s/round sequential {per_round['sequential']:.2f}, packed "
          f"{per_round['packed']:.2f}: RATIO sequential / packed {ratio:.2f}; final per-client accuracy, packed vs "
          f"sequential: largest difference {100 * gap:.2f} points")
    return {"runs": runs, "per_round": per_round, "ratio": ratio, "accuracy_gap": gap}


STEP_WORKLOADS = {
    # pfl-research's cross-device clients: CIFAR-10, 50 images each, cnn4
    "cifar10": {"data": {"dataset": "cifar10", "num_clients": 1000, "partition": "iid", "augment": True},
                "model": {"name": "cnn4"}},
    # experiments/synthetic.yaml: Synthetic(0.5, 0.5) feature vectors, a 2-layer MLP: per-step overhead dominates
    "synthetic": {"data": {"dataset": "synthetic", "options": {"alpha": 0.5, "beta": 0.5, "num_clients": 100},
                           "num_clients": 100, "partition": "natural", "augment": False},
                  "model": {"name": "mlp"}},
}


def _runtime(pack, clients: int = 50, workload: str = "cifar10"):
    """One worker core over the first ``clients`` clients of a workload (no Ray)."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.config import validate
    from fedsim.plan.build import build_plan, load_inputs

    sgd = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4}
    cfg = validate({"name": "bench-packed", "seed": 0, "algorithm": "fedavg", "out_dir": "/tmp/fedsim-bench-runs",
                    **STEP_WORKLOADS[workload],
                    "train": {"local_epochs": 1, "batch_size": PFL_BATCH, "body": sgd, "head": sgd},
                    "engine": {"threads_per_worker": 1, "pack": pack}})
    plan = build_plan(cfg, load_inputs(cfg))
    return ClientRuntime(plan.for_workers(), {c: plan.clients[c] for c in range(clients)})


def steps(args) -> dict:
    """Client-steps per second: sequential training of 50 clients vs packed at each size (interleaved)."""
    out = {}
    for workload in args.workloads:
        sizes = [1, 2, 4, 8, 16, 50]
        runtimes = {g: _runtime(g, 50, workload) for g in sizes}
        seconds: dict[int, list[float]] = {g: [] for g in sizes}
        for _ in range(args.reps):
            for g, rt in runtimes.items():
                broadcast = {"weights": rt.plan.model.initial["shared"]}
                start = time.perf_counter()
                list(rt.train_clients(broadcast, list(range(50)), 1))
                seconds[g].append(time.perf_counter() - start)
        client_steps = sum(steps_per_epoch(len(rt.client_data[c].train), PFL_BATCH) for c in range(50))
        rates = {g: client_steps / min(s) for g, s in seconds.items()}
        print(f"\n{workload}: client-steps/s on one worker core (50 clients, b = {PFL_BATCH}, {client_steps} steps):")
        for g, rate in rates.items():
            print(f"  {'sequential' if g == 1 else f'pack {g}':<12}{rate:>8.1f}   x{rate / rates[1]:.2f}")
        out[workload] = {"seconds": seconds, "rates": rates}
    return out


def profile(args) -> dict:
    """Where the time of 50 cross-device clients goes, sequential and packed (torch.profiler, self CPU time by
    operator): the explanation of a missed CPU target."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    table = {}
    for pack in (1, int(args.profile_pack)):
        rt = _runtime(pack)
        broadcast = {"weights": rt.plan.model.initial["shared"]}
        list(rt.train_clients(broadcast, list(range(50)), 1))  # warm-up
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            list(rt.train_clients(broadcast, list(range(50)), 1))
        table[pack] = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    seq, packed = table[1], table[int(args.profile_pack)]
    print(f"\nself CPU seconds by operator, 50 cross-device clients: sequential vs pack {args.profile_pack}")
    print(f"  {'operator':<42}{'sequential':>11}{'packed':>9}{'ratio':>7}")
    for op in sorted(set(seq) | set(packed), key=lambda k: -max(seq.get(k, 0), packed.get(k, 0)))[:14]:
        a, b = seq.get(op, 0.0), packed.get(op, 0.0)
        print(f"  {op[:42]:<42}{a:>11.3f}{b:>9.3f}{(b / a if a else float('inf')):>7.2f}")
    print(f"  {'total':<42}{sum(seq.values()):>11.3f}{sum(packed.values()):>9.3f}")
    return {"sequential": seq, "packed": packed}


MEMORY_PROBE = """
import sys, json
sys.path.insert(0, {bench!r})
from packed import _runtime


def status(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1])


g, pack = int(sys.argv[1]), sys.argv[2]
rt = _runtime(pack if pack == "auto" else int(pack), clients=g)
broadcast = {{"weights": rt.plan.model.initial["shared"]}}
list(rt.train_clients(broadcast, list(range(g)), 1))  # warm: allocator, kernels, each client's data on the device
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the current resident size
before = status("VmRSS")
list(rt.train_clients(broadcast, list(range(g)), 1))
print(json.dumps({{"g": g, "before_kb": before, "peak_kb": status("VmHWM")}}))
"""


def memory(args) -> dict:
    """Peak resident memory a worker core adds while it trains G cross-device clients (a fresh process per G; the
    peak reset just before, after a warm-up round of the same clients), packed as one pack or sequentially."""
    out = {}
    for g in (2, 8, 32):
        for pack in ("1", str(g)):
            proc = subprocess.run([sys.executable, "-c", MEMORY_PROBE.format(bench=str(REPO / "benchmarks")),
                                   str(g), pack], capture_output=True, text=True, check=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            added = (r["peak_kb"] - r["before_kb"]) / 1024
            out[f"{g}-{pack}"] = {**r, "added_mb": added}
            print(f"  {g:>3} clients {'sequential' if pack == '1' else 'one pack':<11} peak +{added:7.1f} MB "
                  f"({added / g:6.2f} MB per client)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="+", choices=["crossdevice", "quickstart", "steps", "memory", "profile"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=["cifar10", "synthetic"], choices=list(STEP_WORKLOADS),
                    help="steps: whose clients")
    ap.add_argument("--profile-pack", default="8", help="profile: the pack size set against sequential")
    ap.add_argument("--pack", default="auto", help="engine.pack of the packed side (a number or auto)")
    args = parse(ap, rounds=1, reps=1, workloads=["synthetic"])
    args.pack = args.pack if args.pack == "auto" else int(args.pack)
    results = {"args": vars(args), "machine": machine()}
    for what in args.what:
        results[what] = {"crossdevice": crossdevice, "quickstart": quickstart_pair, "steps": steps,
                         "memory": memory, "profile": profile}[what](args)
    print(f"raw: {save('packed', results)}")


if __name__ == "__main__":
    main()
