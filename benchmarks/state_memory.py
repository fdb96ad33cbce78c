"""Per-client state beyond RAM: a worker's resident memory with and without engine.state_ram_mb, and the
bytes a full and an incremental checkpoint write. One VectorStore of FedPer K_P = 2 personal parts of cnn4
(CIFAR-10), filled with N clients in a fresh process per variant (no Ray, no training: the store alone).

Stages, each followed by /proc/self/status (VmRSS, RssAnon, RssFile, VmHWM): store N clients -> write a
full checkpoint shard (reads every row) -> store ``--changed`` clients again and write a delta shard.

    .venv/bin/python benchmarks/state_memory.py [--clients 10000 100000] [--budgets-mb 0 1024] [--changed 100]

A budget of 0 means no budget (all in RAM); all-in-RAM runs are skipped for N whose state would not fit
comfortably on this machine (see --ram-limit-gb).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, log, parse


def memory_kb() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}


def personal_size() -> int:
    from fedsim.models import build_model

    net = build_model("cnn4", 10, (3, 32, 32))
    _, head = net.split_keys(2)
    state = net.state_dict()
    return sum(state[k].numel() for k in head)


def child(clients: int, budget_mb: int, changed: int) -> dict:
    import numpy as np

    from fedsim.core.checkpoint import write_worker_state
    from fedsim.core.store import StateMemory, VectorStore

    size = personal_size()
    out = {"clients": clients, "budget_mb": budget_mb, "floats_per_client": size, "start": memory_kb()}
    store = VectorStore(size, StateMemory(budget_mb << 20 if budget_mb else 1 << 62))
    vector = np.random.default_rng(0).standard_normal(size, dtype=np.float32)
    started = time.perf_counter()
    for client in range(clients):
        vector[0] = client  # every row distinct, every page written
        store[client] = vector
    out["fill_s"] = time.perf_counter() - started
    out["filled"] = memory_kb()
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-ckpt-") as tmp:
        started = time.perf_counter()
        write_worker_state(Path(tmp, "full.npz"), {"personal": store})
        out["full_s"], out["full_bytes"] = time.perf_counter() - started, Path(tmp, "full.npz").stat().st_size
        store.mark_saved()
        out["after_full_checkpoint"] = memory_kb()
        for client in range(0, clients, clients // changed):
            store[client] = vector
        started = time.perf_counter()
        write_worker_state(Path(tmp, "delta.npz"), {"personal": dict(store.changed_items())})
        out["delta_s"], out["delta_bytes"] = time.perf_counter() - started, Path(tmp, "delta.npz").stat().st_size
        out["delta_clients"] = len(store.changed)
    out["end"] = memory_kb()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--budgets-mb", type=int, nargs="+", default=[0, 1024])
    parser.add_argument("--changed", type=int, default=100, help="clients trained between the two checkpoints")
    parser.add_argument("--ram-limit-gb", type=float, default=6.0, help="skip all-in-RAM runs needing more")
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parse(parser, clients=[200], budgets_mb=[0, 1], changed=10)
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    size = personal_size()
    results = []
    for clients in args.clients:
        for budget in args.budgets_mb:
            if budget == 0 and clients * size * 4 > args.ram_limit_gb * 2**30:
                log(f"N={clients} all in RAM: skipped ({clients * size * 4 / 2**30:.1f} GiB > --ram-limit-gb)")
                continue
            proc = subprocess.run([sys.executable, __file__, "--child", str(clients), str(budget), str(args.changed)],
                                  capture_output=True, text=True, env=env, check=True)
            row = json.loads(proc.stdout.splitlines()[-1])
            results.append(row)
            grow = {k: (row["filled"][k] - row["start"][k]) >> 10 for k in ("VmRSS", "RssAnon", "RssFile")}
            log(f"N={clients} budget={budget or 'none'} MB: state {clients * size * 4 / 2**20:.0f} MB; RSS at start "
                f"{row['start']['VmRSS'] >> 10} MB, after fill +{grow['VmRSS']} MB (anon +{grow['RssAnon']}, file "
                f"+{grow['RssFile']}), after full ckpt {row['after_full_checkpoint']['VmRSS'] >> 10} MB, peak "
                f"{row['end']['VmHWM'] >> 10} MB; "
                f"fill {row['fill_s']:.1f} s; full ckpt {row['full_bytes'] / 2**20:.1f} MB in {row['full_s']:.1f} s, "
                f"delta ({row['delta_clients']} clients) {row['delta_bytes'] / 2**20:.2f} MB in {row['delta_s']:.2f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "state_memory.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
