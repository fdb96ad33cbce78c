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

import os
import threading

from _common import descendants, log, quickstart, set_dotted


class TreeCpu:
    """Every second: CPU seconds each process of this tree used (by title), to see who competes with
    the workers during start-up and round 1 (Ray agents, prestarted idle workers, the driver actor)."""

    def __init__(self):
        self.rows: list[tuple[float, str, float]] = []  # (time, title, cpu seconds in the last second)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._hz = os.sysconf("SC_CLK_TCK")

    def _ticks(self) -> dict[int, tuple[str, int]]:
        out = {}
        for pid in descendants():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")[0].decode(errors="replace")
                if "python" in cmd or cmd.startswith("ray::"):
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        parts = f.read().split(b"\0")
                    cmd = cmd if cmd.startswith("ray::") else " ".join(p.decode(errors="replace").split("/")[-1]
                                                                      for p in parts[:3])
                out[pid] = (cmd[:60], int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                pass
        return out

    def _loop(self) -> None:
        prev = self._ticks()
        while not self._stop.wait(1.0):
            cur, t = self._ticks(), time.perf_counter()
            for pid, (cmd, ticks) in cur.items():
                d = ticks - prev.get(pid, (cmd, 0))[1]
                if d > 0:
                    self.rows.append((t, f"{cmd} [{pid}]", d / self._hz))
            prev = cur

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def table(self, t0: float, windows: list[tuple[str, float, float]]) -> list[str]:
        out = []
        for name, a, b in windows:
            per: dict[str, float] = {}
            for t, cmd, sec in self.rows:
                if a <= t - t0 < b + 1:
                    per[cmd] = per.get(cmd, 0) + sec
            out.append(f"  {name} ({a:.1f} -> {b:.1f} s): CPU seconds by process")
            for cmd, sec in sorted(per.items(), key=lambda kv: -kv[1])[:10]:
                out.append(f"    {sec:6.2f}  {cmd}")
        return out


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
    with TreeCpu() as cpu:
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
    first_get = [(a, b) for n, a, b in marks if n == "ray.get (entrypoint)"]
    start_done = first_get[0][1] - t0 if first_get else 0.0
    windows = [("start-up: run() until the workers answered", 0.0, start_done)]
    if rounds:
        windows.append(("round 1", start_done, rounds[0] - t0))
    if len(rounds) > 1:
        windows.append(("round 2", rounds[0] - t0, rounds[1] - t0))
    print()
    print("\n".join(cpu.table(t0, windows)))
    log(f"trace: {args.trace}")


if __name__ == "__main__":
    main()
