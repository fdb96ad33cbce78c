"""Start-up pieces of a fedsim run, in isolation, on a fresh local Ray each repetition.

  ray.init          (as fedsim.engine.simulation.connect_ray calls it)
  actor spawn       time until 2 actors that import fedsim's worker module answer a call, with and
                    without a per-actor runtime_env (fedsim's Driver gives each worker
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": ..}}), and spawned directly vs
                    from inside another actor that must first import fedsim itself (fedsim's
                    entrypoint -> Driver actor -> worker actors chain)
  ray.shutdown

    .venv/bin/python benchmarks/profile_spawn.py [--reps 3]
"""
from __future__ import annotations

import argparse
import os
import time

from _common import log, median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import ray

    @ray.remote
    class Importer:
        def __init__(self):
            import fedsim.engine.worker  # noqa: F401  (torch, lightning, fedsim: what a worker imports)

        def ping(self):
            return os.getpid()

    @ray.remote
    class Parent:
        """Stands for fedsim's Driver actor: imports fedsim, then spawns the workers."""

        def __init__(self, env: bool):
            import fedsim.engine.worker  # noqa: F401

            opts = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}} if env else {}
            self.kids = [Importer.options(num_cpus=1, **opts).remote() for _ in range(2)]

        def ready(self):
            return ray.get([k.ping.remote() for k in self.kids])

    rows: dict[str, list[float]] = {}
    variants = {
        "2 workers, runtime_env env_vars (as fedsim)": ("direct", True),
        "2 workers, no runtime_env": ("direct", False),
        "driver actor -> 2 workers, runtime_env (as fedsim)": ("chain", True),
        "driver actor -> 2 workers, no runtime_env": ("chain", False),
    }
    for rep in range(args.reps):
        for label, (how, env) in variants.items():
            t0 = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
            t1 = time.perf_counter()
            if how == "direct":
                opts = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}} if env else {}
                kids = [Importer.options(num_cpus=1, **opts).remote() for _ in range(2)]
                ray.get([k.ping.remote() for k in kids], timeout=300)
            else:
                parent = Parent.options(num_cpus=0).remote(env)
                ray.get(parent.ready.remote(), timeout=300)
            t2 = time.perf_counter()
            ray.shutdown()
            t3 = time.perf_counter()
            rows.setdefault("ray.init", []).append(t1 - t0)
            rows.setdefault("ray.shutdown", []).append(t3 - t2)
            rows.setdefault(label, []).append(t2 - t1)
            log(f"  rep {rep} {label}: init {t1 - t0:.1f} s, spawn {t2 - t1:.1f} s, shutdown {t3 - t2:.1f} s")
    print(f"\nmedians of {args.reps} reps (fresh local Ray each), seconds")
    for label, xs in rows.items():
        print(f"  {label:<52}{median(xs):6.2f}")


if __name__ == "__main__":
    main()
