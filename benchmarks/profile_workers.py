"""py-spy profile of fedsim's worker actors (and the driver actor) during the steady rounds of a run.

Runs a fedsim config in this process; when round --skip finishes, `py-spy record --format raw`
attaches to every `ray::Worker` / `ray::Driver` process for --seconds, then the collapsed
stacks are summarised: inclusive share of samples per fedsim/torch/ray function, per process.
No fedsim file is changed.

    .venv/bin/python benchmarks/profile_workers.py --preset device          # 1000 clients x 50, f = 0.1, FedAvg
    .venv/bin/python benchmarks/profile_workers.py --preset quickstart
    .venv/bin/python benchmarks/profile_workers.py --preset scale --set data.num_clients=10000
Raw files stay in --out (default /tmp/fedsim-pyspy) for speedscope / flamegraph tools.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import threading
import time
from pathlib import Path

import yaml

from _common import BENCH, descendants, log, proc_memory, quickstart, run_fedsim, set_dotted

PY_SPY = Path(os.environ.get("PY_SPY", BENCH.parent / ".venv" / "bin" / "py-spy"))


def preset(name: str) -> dict:
    if name == "quickstart":
        return quickstart({"train.rounds": 3, "name": "bench-profile"})
    if name == "device":
        return quickstart({"name": "bench-profile", "algorithm": "fedavg", "data.partition": "iid",
                           "data.num_clients": 1000, "data.train_fraction": 1.0, "data.test_fraction": 1.0,
                           "train.fraction": 0.1, "train.local_epochs": 1, "train.rounds": 6, "train.eval_every": 7})
    if name == "scale":
        return quickstart({"name": "bench-profile", "data.partition": "iid", "data.num_clients": 1000,
                           "data.train_fraction": 0.1, "data.test_fraction": 0.1, "train.fraction": 0.1,
                           "train.rounds": 4, "train.eval_every": 5})
    raise SystemExit(f"unknown preset {name}")


def summarize(raw: Path, top: int) -> list[str]:
    """Inclusive sample share per frame 'function (file)' from py-spy's collapsed 'a;b;c count' lines."""
    inclusive: collections.Counter = collections.Counter()
    leaf: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].split("/")[-1] + ")" if " (" in f else f
                  for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += n
        leaf[frames[-1]] += n
    if not total:
        return ["  (no samples)"]
    out = [f"  {total} samples; inclusive % (self %) of the hottest frames:"]
    for f, n in inclusive.most_common(top):
        out.append(f"  {100 * n / total:5.1f}% ({100 * leaf[f] / total:4.1f}%)  {f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="device", choices=["quickstart", "device", "scale"])
    ap.add_argument("--set", nargs="*", default=[], help="dotted key=value overrides")
    ap.add_argument("--skip", type=int, default=1, help="start profiling when this round has finished")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--top", type=int, default=28)
    ap.add_argument("--out", default="/tmp/fedsim-pyspy")
    args = ap.parse_args()

    tree = preset(args.preset)
    for pair in args.set:
        key, _, value = pair.partition("=")
        set_dotted(tree, key, yaml.safe_load(value))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Path, subprocess.Popen]] = []

    def attach() -> None:
        for pid in sorted(descendants()):
            m = proc_memory(pid)
            if m and (m["cmd"].startswith("ray::Worker") or m["cmd"].startswith("ray::Driver")):
                kind = "driver" if "Driver" in m["cmd"] else "worker"
                raw = out / f"{args.preset}-{kind}-{pid}.txt"
                cmd = [str(PY_SPY), "record", "--pid", str(pid), "--format", "raw", "--duration",
                       str(int(args.seconds)), "--rate", "200", "--nonblocking", "-o", str(raw)]
                jobs.append((f"{kind} {pid}", raw, subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                                    stderr=subprocess.DEVNULL)))

    done = {"n": 0}

    def on_round_hook() -> None:
        done["n"] += 1
        if done["n"] == args.skip:
            threading.Thread(target=attach, daemon=True).start()

    import fedsim.engine as engine

    real_run = engine.run

    def run_with_hook(cfg, overwrite=False, on_round=None, **kw):
        def cb(row, res):
            on_round_hook()
            if on_round:
                on_round(row, res)
        return real_run(cfg, overwrite=overwrite, on_round=cb, **kw)

    engine.run = run_with_hook
    t0 = time.perf_counter()
    r = run_fedsim(tree)
    engine.run = real_run
    for _, _, p in jobs:
        p.wait(timeout=args.seconds + 60)
    print(f"{args.preset}: rounds {[round(s, 2) for s in r['round_s']]}, end to end {time.perf_counter() - t0:.1f} s")
    for label, raw, _ in jobs:
        print(f"\n{label}  ({raw})")
        if raw.exists():
            print("\n".join(summarize(raw, args.top)))
    log("py-spy sampled --nonblocking at 200 Hz; idle threads excluded (samples = time on CPU or in a call)")


if __name__ == "__main__":
    main()
