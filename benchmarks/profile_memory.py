"""What a worker's memory grows with: one fedsim worker core (ClientRuntime, no Ray) in a fresh
process, its RssAnon read after each stage, for several client counts.

Stages: construct with N clients (indices only) -> train T clients (personal vectors appear),
--per-call clients per train() call -> evaluate all N clients -> train T other clients. With Ray, the same object lives in a worker actor;
this isolates what the engine's own data structures cost per client from Ray and the driver.

    .venv/bin/python benchmarks/profile_memory.py [--clients 1000 10000] [--trained 200] [--per-call 50]
        [--trim] [--tracemalloc]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _common import log, quickstart

CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000


def anon_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))


def child(n: int, trained: int, use_tracemalloc: bool, trim: bool = False, per_call: int = 50) -> dict:
    import gc
    import tracemalloc

    from fedsim.config import validate
    from fedsim.data import load_dataset, make_partition
    from fedsim.engine.worker import ClientData, ClientRuntime

    tree = quickstart({"data.partition": "iid", "data.num_clients": n,
                       "data.train_fraction": min(1.0, n * 5 / CIFAR_TRAIN),
                       "data.test_fraction": min(1.0, n / CIFAR_TEST)})
    cfg = validate(tree)
    data = load_dataset("cifar10")
    part = make_partition("iid", data.train_y, data.test_y, n, 0, train_fraction=tree["data"]["train_fraction"],
                          test_fraction=tree["data"]["test_fraction"])
    mine = {c: ClientData(part.train[c], part.test[c]) for c in range(0, n, 2)}  # worker 0 of 2
    out = {"n": n, "owned": len(mine), "per_call": per_call, "stages": {}}

    import ctypes

    libc = ctypes.CDLL("libc.so.6")

    def mark(stage: str) -> None:
        gc.collect()
        out["stages"][stage] = {"anon_kb": anon_kb()}
        if trim:  # what of it is free heap that glibc kept (fragmentation), not live objects
            libc.malloc_trim(0)
            out["stages"][stage]["trimmed_kb"] = anon_kb()
        if use_tracemalloc:
            out["stages"][stage]["traced_kb"] = tracemalloc.get_traced_memory()[0] // 1024

    mark("data only (before worker)")
    if use_tracemalloc:
        tracemalloc.start()
    rt = ClientRuntime(cfg.model_dump(), mine)
    mark("worker constructed")
    from fedsim.engine.worker import shared_layout

    layout, shared = shared_layout(cfg, data.num_classes, data.input_shape)
    owned = sorted(mine)
    def train(clients: list[int], round_idx: int) -> None:
        # In chunks, as a Ray worker receives them (one call per round with its share of the sampled
        # clients): a call returns every client's full shared vector at once, so the chunk size sets the
        # transient heap that glibc keeps afterwards.
        for i in range(0, len(clients), per_call):
            rt.train(shared, clients[i:i + per_call], round_idx)

    train(owned[:trained], 1)
    mark(f"trained {trained}")
    rt.evaluate(shared, owned, 1)
    mark(f"evaluated all {len(owned)}")
    train(owned[trained:2 * trained], 2)
    mark(f"trained {trained} more")
    if use_tracemalloc:
        snap = tracemalloc.take_snapshot()
        out["top"] = [str(s) for s in snap.statistics("lineno")[:12]]
    out["personal_vectors"] = len(rt.personal)
    out["personal_bytes"] = int(sum(v.nbytes for _, v in rt.personal.items()))
    out["index_bytes"] = int(sum(cd.train.nbytes + cd.test.nbytes for cd in mine.values()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--trained", type=int, default=200)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--trim", action="store_true", help="also report RssAnon after malloc_trim(0)")
    ap.add_argument("--per-call", type=int, default=50, help="clients per train call (a worker's share of a "
                    "round: 50 = 100 sampled clients over 2 workers)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.trained, args.tracemalloc, args.trim, args.per_call)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rows = []
    for n in args.clients:
        cmd = [sys.executable, __file__, "--child", str(n), "--trained", str(args.trained),
               "--per-call", str(args.per_call)]
        cmd += ["--tracemalloc"] if args.tracemalloc else []
        cmd += ["--trim"] if args.trim else []
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode:
            log(res.stderr[-3000:])
            raise SystemExit(1)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    for r in rows:
        print(f"\nN = {r['n']} ({r['owned']} clients on this worker); personal vectors {r['personal_vectors']} "
              f"= {r['personal_bytes'] / 1e6:.2f} MB, index arrays {r['index_bytes'] / 1e6:.3f} MB")
        prev = None
        for stage, s in r["stages"].items():
            delta = "" if prev is None else f"  (+{(s['anon_kb'] - prev) / 1024:7.1f} MB)"
            traced = f"  python-traced {s['traced_kb'] / 1024:7.1f} MB" if "traced_kb" in s else ""
            traced += f"  after malloc_trim {s['trimmed_kb'] / 1024:8.1f} MB" if "trimmed_kb" in s else ""
            print(f"  {stage:<28} RssAnon {s['anon_kb'] / 1024:8.1f} MB{delta}{traced}")
            prev = s["anon_kb"]
        for line in r.get("top", []):
            print("   ", line)
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        for stage in a["stages"]:
            if stage in b["stages"]:
                per = (b["stages"][stage]["anon_kb"] - a["stages"][stage]["anon_kb"]) * 1024 / (b["owned"] - a["owned"])
                print(f"per owned client, {stage:<28}: {per:10,.0f} B")


if __name__ == "__main__":
    main()
