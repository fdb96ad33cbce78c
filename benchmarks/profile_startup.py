"""Where fedsim's start-up goes: a timeline of one short quickstart run.

Driver-process phases are timed by wrapping fedsim.engine.simulation's functions in this process
(no fedsim file is changed); actor-side phases (process start, module import, __init__, first
round's tasks) come from ray.timeline(), read before ray.shutdown.

    .venv/bin/python benchmarks/profile_startup.py [--rounds 1] [--workers 2] [--trace /tmp/fedsim-timeline.json]
"""
from __future__ import annotations

import argparse
import functools
import json
import time

from _common import log, quickstart, set_dotted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--trace", default="/tmp/fedsim-timeline.json", help="chrome://tracing file of the Ray events")
    ap.add_argument("--set", nargs="*", default=[], help="extra dotted key=value config overrides")
    args = ap.parse_args()

    import ray
    import yaml

    from fedsim.config import validate
    from fedsim.engine import simulation

    marks: list[tuple[str, float, float]] = []

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                marks.append((name, t, time.perf_counter()))
        return wrapper

    for name in ("prepare_inputs", "_start_new", "connect_ray", "check_resources"):
        if hasattr(simulation, name):
            setattr(simulation, name, timed(name, getattr(simulation, name)))
    real_get = ray.get
    simulation.ray.get = timed("ray.get (entrypoint)", real_get)

    tree = quickstart({"train.rounds": args.rounds, "engine.workers": args.workers})
    for pair in args.set:
        key, _, value = pair.partition("=")
        set_dotted(tree, key, yaml.safe_load(value))
    cfg = validate(tree)
    rounds: list[float] = []
    t0 = time.perf_counter()
    simulation.run(cfg, overwrite=True, on_round=lambda row, res: rounds.append(time.perf_counter()))
    t_run = time.perf_counter()
    events = ray.timeline()
    simulation.ray.get = real_get
    ray.shutdown()
    t_end = time.perf_counter()
    with open(args.trace, "w") as f:
        json.dump(events, f)

    print(f"fedsim quickstart, {args.rounds} round(s), {args.workers} workers: run() {t_run - t0:.2f} s, "
          f"ray.shutdown {t_end - t_run:.2f} s")
    print("\nentrypoint (this process), seconds from run():")
    for name, a, b in marks:
        if b - a >= 0.05:
            print(f"  {a - t0:7.2f} -> {b - t0:7.2f}  {b - a:6.2f}  {name}")
    for i, t in enumerate(rounds, 1):
        print(f"  round {i} done at {t - t0:7.2f}")

    # Ray timeline: complete events ("ph": "X") with ts/dur in microseconds, per worker process.
    spans = [e for e in events if e.get("ph") == "X"]
    if spans:
        origin = min(e["ts"] for e in spans)
        # align: the first Ray event happens after ray.init returned in this process
        init_end = next((b for n, a, b in marks if n == "connect_ray"), t0)
        print("\nactor side (Ray timeline; seconds from run(), aligned at ray.init's return):")
        rows = []
        for e in spans:
            name = e.get("name", "")
            if e["dur"] < 50_000 and not name.endswith("__init__"):
                continue
            start = (e["ts"] - origin) / 1e6 + (init_end - t0)
            rows.append((start, e["dur"] / 1e6, f"pid {e.get('pid')}", e.get("cat", ""), name))
        for start, dur, pid, cat, name in sorted(rows)[:60]:
            print(f"  {start:7.2f} +{dur:6.2f}  {pid:<22} {cat:<22} {name}")
    log(f"trace: {args.trace}")


if __name__ == "__main__":
    main()
