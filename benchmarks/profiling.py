"""Profiles behind BENCHMARKS.md, one subcommand each (the ratio benchmarks are the other scripts):

  startup  where a run's start-up goes: the entrypoint's phases, Ray's actor timeline, CPU seconds
           per process (one short quickstart run)
  spawn    ray.init, spawning 2 worker-like actors (with and without a per-actor runtime_env,
           directly or from a torch-importing parent actor) and ray.shutdown, on a fresh Ray each rep
  pyspy    `py-spy record` on the worker and server actors during a run's steady rounds, summarised
  step     one client's training: fedsim's worker core (ClientRuntime, channels_last and NCHW) vs a
           plain PyTorch loop, in this process, 1 thread
  compute  NCHW vs channels_last for cnn4's training step and evaluation forward alone, plain PyTorch
  memory   the worker core's RssAnon by stage (construct, train, evaluate, train more), per client
           count, each in a fresh process
  fixedcost  what a client costs beyond its SGD steps, as a ratio to one step of batch 50, per model
  aggmem   the server's transient memory while it aggregates W partials (tracemalloc), per model

    .venv/bin/python benchmarks/profiling.py startup [--rounds 1] [--workers 2]
    .venv/bin/python benchmarks/profiling.py spawn [--reps 3]
    .venv/bin/python benchmarks/profiling.py pyspy --preset quickstart|device|scale
    .venv/bin/python benchmarks/profiling.py step [--samples 5000] [--reps 3]
    .venv/bin/python benchmarks/profiling.py compute [--reps 5]
    .venv/bin/python benchmarks/profiling.py memory [--clients 1000 10000] [--trim]
    .venv/bin/python benchmarks/profiling.py fixedcost [--models cnn4 mobilenet_v1 resnet34] [--baseline DIR]
    .venv/bin/python benchmarks/profiling.py aggmem [--model resnet34] [--workers 2]
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import functools
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from _common import (BENCH, REPO, Periodic, descendants, fixed_point_scales, log, machine, median, proc_memory, proc_table,
                     process_tree, quickstart, run_fedsim, save, worker_runtime)
from fedsim.config import set_dotted  # after _common, which sets the environment fedsim reads

CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000
ACTOR_TITLES = {"ray::Worker": "worker", "ray::Server": "server"}  # process titles of fedsim's actors


def apply_sets(tree: dict, pairs: list[str]) -> dict:
    """``key.sub=value`` overrides from the command line, values parsed as YAML scalars."""
    for pair in pairs:
        key, _, value = pair.partition("=")
        set_dotted(tree, key, yaml.safe_load(value))
    return tree


# -- startup ---------------------------------------------------------------------------------------
def process_title(pid: int) -> str:
    """An actor's Ray title (``ray::Worker``), else the first words of a python command line."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        parts = f.read().split(b"\0")
    cmd = parts[0].decode(errors="replace")
    if cmd.startswith("ray::"):
        return cmd[:60]
    return " ".join(p.decode(errors="replace").split("/")[-1] for p in parts[:3])[:60]


class TreeCpu(Periodic):
    """Every second, the CPU seconds each python or Ray process of this tree used (by title): who competes
    with the workers during start-up and round 1 (Ray agents, prestarted idle workers, the server actor)."""

    def __init__(self):
        super().__init__(1.0)
        self.rows: list[tuple[float, str, float]] = []  # (time, title [pid], CPU seconds in the last second)
        self._hz = os.sysconf("SC_CLK_TCK")
        self._prev = {pid: ticks for pid, (_, ticks) in proc_table().items()}  # pid -> ticks at the last sample

    def sample(self) -> None:
        table, t = proc_table(), time.perf_counter()
        for pid in process_tree(table, os.getpid()):
            try:
                title = process_title(pid)
            except OSError:
                continue
            ticks = table[pid][1]
            if ("python" in title or title.startswith("ray::")) and ticks > self._prev.get(pid, 0):
                self.rows.append((t, f"{title} [{pid}]", (ticks - self._prev.get(pid, 0)) / self._hz))
            self._prev[pid] = ticks

    def table(self, t0: float, windows: list[tuple[str, float, float]]) -> list[str]:
        out = []
        for name, a, b in windows:
            per: dict[str, float] = collections.Counter()
            for t, title, sec in self.rows:
                if a <= t - t0 < b + 1:
                    per[title] += sec
            out.append(f"  {name} ({a:.1f} -> {b:.1f} s): CPU seconds by process")
            out += [f"    {sec:6.2f}  {title}" for title, sec in per.most_common(10)]
        return out


def startup(args) -> None:
    """The entrypoint's phases are timed by wrapping the engine's functions in this process
    (no fedsim file changes); the actors' (process start, imports, __init__, first tasks) come from
    ray.timeline(), read before ray.shutdown."""
    import ray

    from fedsim.config import validate
    from fedsim.engine import backend, preflight, ray_cluster, runfolder
    from fedsim.engine.driver import Callback
    from fedsim.simulate import run

    class Stamps(Callback):
        def on_round_end(self, run, result) -> None:
            rounds.append(time.perf_counter())

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

    # Each phase wrapped where the run looks it up: the preflight's by name in its module, Ray's and the engine's
    # start imported from their modules when the Ray backend reserves and starts.
    for module, name in ((preflight, "load_inputs"), (preflight, "build_plan"), (ray_cluster, "connect_ray"),
                         (ray_cluster, "check_resources"), (backend, "start_engine")):
        setattr(module, name, timed(name, getattr(module, name)))
    runfolder.RunFolder.create = timed("RunFolder.create", runfolder.RunFolder.create)
    real_get = ray.get
    ray.get = timed("ray.get (entrypoint)", real_get)

    cfg = validate(apply_sets(quickstart({"train.rounds": args.rounds, "engine.workers": args.workers}), args.set))
    rounds: list[float] = []
    t0 = time.perf_counter()
    try:
        with TreeCpu() as cpu:
            run(cfg, overwrite=True, callbacks=[Stamps()])
        t_run = time.perf_counter()
        events = ray.timeline()
    finally:
        ray.get = real_get
        ray.shutdown()
    t_end = time.perf_counter()
    Path(args.trace).write_text(json.dumps(events))

    print(f"fedsim quickstart, {args.rounds} round(s), {args.workers} workers: run() {t_run - t0:.2f} s, "
          f"ray.shutdown {t_end - t_run:.2f} s")
    print("\nentrypoint (this process), seconds from run():")
    for name, a, b in marks:
        if b - a >= 0.05:
            print(f"  {a - t0:7.2f} -> {b - t0:7.2f}  {b - a:6.2f}  {name}")
    for i, t in enumerate(rounds, 1):
        print(f"  round {i} done at {t - t0:7.2f}")
    print_actor_timeline(events, next((b for n, a, b in marks if n == "connect_ray"), t0) - t0)
    first_get = [b for n, a, b in marks if n == "ray.get (entrypoint)"]
    ready = first_get[0] - t0 if first_get else 0.0
    windows = [("start-up: run() until the workers answered (server.restore)", 0.0, ready)]
    bounds = [ready, *(t - t0 for t in rounds[:2])]
    windows += [(f"round {i}", a, b) for i, (a, b) in enumerate(zip(bounds, bounds[1:]), 1)]
    print()
    print("\n".join(cpu.table(t0, windows)))
    log(f"trace (chrome://tracing): {args.trace}")


def print_actor_timeline(events: list[dict], init_end_s: float) -> None:
    """Ray's complete events ("ph": "X", ts/dur in microseconds) of 50 ms or more, and every __init__,
    aligned so that the first one starts when ray.init returned in this process."""
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return
    origin = min(e["ts"] for e in spans)
    print("\nactor side (Ray timeline; seconds from run(), aligned at ray.init's return):")
    rows = [((e["ts"] - origin) / 1e6 + init_end_s, e["dur"] / 1e6, f"pid {e.get('pid')}", e.get("cat", ""),
             e.get("name", "")) for e in spans if e["dur"] >= 50_000 or e.get("name", "").endswith("__init__")]
    for start, dur, pid, cat, name in sorted(rows)[:60]:
        print(f"  {start:7.2f} +{dur:6.2f}  {pid:<22} {cat:<22} {name}")


# -- spawn -----------------------------------------------------------------------------------------
SPAWN_VARIANTS = {  # label: (spawned by, per-actor runtime_env)
    "2 workers, no runtime_env (fedsim today)": ("entrypoint", False),
    "2 workers, runtime_env env_vars": ("entrypoint", True),
    "torch-importing parent actor -> 2 workers, no runtime_env": ("parent", False),
    "torch-importing parent actor -> 2 workers, runtime_env (fedsim before)": ("parent", True),
}
THREAD_ENV = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}}


def spawn(args) -> None:
    """A 'worker' here is an actor that imports what fedsim's worker imports (fedsim.client.runtime: torch,
    Lightning, fedsim) and answers a ping; the parent stands for a server actor that imports torch itself
    before spawning the workers (fedsim's server no longer does)."""
    import ray

    @ray.remote
    class Importer:
        def __init__(self):
            import fedsim.client.runtime  # noqa: F401

        def ping(self) -> int:
            return os.getpid()

    @ray.remote
    class Parent:
        def __init__(self, env: bool):
            import fedsim.client.runtime  # noqa: F401

            self.kids = [Importer.options(num_cpus=1, **(THREAD_ENV if env else {})).remote() for _ in range(2)]

        def ready(self) -> list[int]:
            return ray.get([k.ping.remote() for k in self.kids], timeout=300)

    rows: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for label, (spawner, env) in SPAWN_VARIANTS.items():
            t0 = time.perf_counter()
            ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning",
                     log_to_driver=False)
            t1 = time.perf_counter()
            try:
                if spawner == "entrypoint":
                    kids = [Importer.options(num_cpus=1, **(THREAD_ENV if env else {})).remote() for _ in range(2)]
                    ray.get([k.ping.remote() for k in kids], timeout=300)
                else:
                    ray.get(Parent.options(num_cpus=0).remote(env).ready.remote(), timeout=300)
                t2 = time.perf_counter()
            finally:
                ray.shutdown()
            t3 = time.perf_counter()
            for key, seconds in (("ray.init", t1 - t0), (label, t2 - t1), ("ray.shutdown", t3 - t2)):
                rows.setdefault(key, []).append(seconds)
            log(f"  rep {rep} {label}: init {t1 - t0:.1f} s, spawn {t2 - t1:.1f} s, shutdown {t3 - t2:.1f} s")
    print(f"\nmedians of {args.reps} reps (fresh local Ray each), seconds until both workers answered")
    for label, xs in rows.items():
        print(f"  {label:<72}{median(xs):6.2f}")


# -- pyspy -----------------------------------------------------------------------------------------
def pyspy_preset(name: str) -> dict:
    if name == "quickstart":
        return quickstart({"train.rounds": 3, "name": "bench-profile"})
    if name == "device":  # peer_flower.py's cross-device workload, 6 rounds
        return quickstart({"name": "bench-profile", "algorithm": "fedavg", "data.partition": "iid",
                           "data.num_clients": 1000, "data.train_fraction": 1.0, "data.test_fraction": 1.0,
                           "train.fraction": 0.1, "train.local_epochs": 1, "train.rounds": 6, "train.eval_every": 7})
    return quickstart({"name": "bench-profile", "data.partition": "iid", "data.num_clients": 1000,  # scale
                       "data.train_fraction": 0.1, "data.test_fraction": 0.1, "train.fraction": 0.1,
                       "train.rounds": 4, "train.eval_every": 5})


def summarize_pyspy(raw: Path, top: int) -> list[str]:
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
    out += [f"  {100 * n / total:5.1f}% ({100 * leaf[f] / total:4.1f}%)  {f}" for f, n in inclusive.most_common(top)]
    return out


def pyspy(args) -> None:
    """Runs the preset in this process; when round --skip has finished, py-spy attaches to every worker and
    server actor for --seconds (--nonblocking, 200 Hz: idle threads are not sampled)."""
    from fedsim.engine.driver import Callback

    py_spy = Path(os.environ.get("PY_SPY", BENCH.parent / ".venv" / "bin" / "py-spy"))
    if not py_spy.exists():
        raise SystemExit(f"pyspy: no py-spy at {py_spy}; `pip install py-spy` into the venv or set PY_SPY")
    tree = apply_sets(pyspy_preset(args.preset), args.set)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Path, subprocess.Popen]] = []

    def attach() -> None:
        for pid in sorted(descendants()):
            m = proc_memory(pid)
            kind = next((k for title, k in ACTOR_TITLES.items() if m and m["cmd"].startswith(title)), None)
            if kind:
                raw = out / f"{args.preset}-{kind}-{pid}.txt"
                cmd = [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--duration",
                       str(int(args.seconds)), "--rate", "200", "--nonblocking", "-o", str(raw)]
                jobs.append((f"{kind} {pid}", raw, subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                                    stderr=subprocess.DEVNULL)))

    finished = collections.Counter()

    class AttachAfterSkip(Callback):
        def on_round_end(self, run, result) -> None:
            finished["rounds"] += 1
            if finished["rounds"] == args.skip:
                threading.Thread(target=attach, daemon=True).start()

    r = run_fedsim(tree, callbacks=(AttachAfterSkip(),))
    for _, _, p in jobs:
        p.wait(timeout=args.seconds + 60)
    print(f"{args.preset}: rounds {[round(s, 2) for s in r['round_s']]}, end to end {r['end_to_end_s']:.1f} s")
    for label, raw, _ in jobs:
        print(f"\n{label}  ({raw})")
        if raw.exists():
            print("\n".join(summarize_pyspy(raw, args.top)))


# -- step ------------------------------------------------------------------------------------------
def step(args) -> None:
    """engine: ClientRuntime.train_and_sum of one client - what a Ray worker runs per client (load weights, the Lightning module
    via Fabric, 2 optimizers, pack the uploads), memory_format auto (channels_last on CPU) and contiguous;
    plain: the same SGD steps written directly in NCHW (as overhead.py's bare loop and the Flower client).
    engine-nchw / plain is the worker core's own overhead; engine / engine-nchw what the layout buys."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from fedsim.algorithms import WEIGHTS
    from fedsim.client.runtime import client_generator
    from fedsim.config import validate
    from fedsim.core.protocol import ClientData
    from fedsim.data import load_dataset, random_crop_flip, to_float
    from fedsim.models import build_model

    torch.set_num_threads(1)
    configs = {fmt: validate(quickstart({"algorithm": args.algorithm, "data.partition": "iid", "engine.memory_format": fmt,
                                         "train.local_epochs": args.epochs})) for fmt in ("auto", "contiguous")}
    cfg = configs["auto"]
    data = load_dataset("cifar10")
    idx = np.sort(np.random.default_rng(0).choice(len(data.train_y), args.samples, replace=False))
    runtimes = {fmt: worker_runtime(c, {0: ClientData(idx, np.arange(100))}) for fmt, c in configs.items()}
    broadcast = {WEIGHTS: runtimes["auto"].plan.model.initial["shared"]}
    sums = fixed_point_scales(runtimes["auto"], args.samples)

    torch.manual_seed(0)
    net = build_model("cnn4", data.num_classes, data.input_shape)
    body = cfg.train.body
    opt = torch.optim.SGD(net.parameters(), lr=body.lr, momentum=body.momentum, weight_decay=body.weight_decay)
    batch = cfg.train.batch_size

    def plain(round_idx: int) -> None:
        x = to_float(data.train_x[idx], data.mean, data.std)
        y = torch.as_tensor(data.train_y[idx])
        opt.state.clear()
        net.train()
        gen = client_generator(cfg.seed, round_idx, 0)
        for _ in range(args.epochs):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), batch):
                b = order[start:start + batch]
                loss = F.cross_entropy(net(random_crop_flip(x[b], gen)), y[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    cases = {"engine": lambda r: runtimes["auto"].train_and_sum(broadcast, [0], r, sums),
             "engine-nchw": lambda r: runtimes["contiguous"].train_and_sum(broadcast, [0], r, sums), "plain": plain}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.reps + 1):  # rep 0 warms everything up and is dropped
        for name, fn in cases.items():
            t = time.perf_counter()
            fn(rep + 1)
            if rep:
                times[name].append(time.perf_counter() - t)
    e, n, p = (median(times[name]) for name in cases)
    steps = args.epochs * -(-args.samples // batch)
    print(f"one client, {args.samples} images x {args.epochs} epoch(s) = {steps} steps of {batch}, 1 thread, "
          f"{args.algorithm}; medians of {args.reps} interleaved reps")
    print(f"  engine (ClientRuntime), channels_last       {e:7.2f} s  {1000 * e / steps:6.1f} ms/step")
    print(f"  engine, memory_format=contiguous             {n:7.2f} s  {1000 * n / steps:6.1f} ms/step")
    print(f"  plain PyTorch loop, NCHW                     {p:7.2f} s  {1000 * p / steps:6.1f} ms/step")
    print(f"RATIO engine-nchw / plain (worker core overhead): {n / p:.3f}")
    print(f"RATIO engine / plain (what a user gets):          {e / p:.3f}")


# -- compute ---------------------------------------------------------------------------------------
COMPUTE_CASES = [("train step, batch 50", 50, True, 20), ("train step, batch 5", 5, True, 60),
                 ("eval forward, batch 500", 500, False, 5)]  # (label, batch, train, timed calls)


def seconds_per_call(channels_last: bool, batch: int, train: bool, calls: int) -> float:
    """cnn4 on random images in plain PyTorch (no engine): a training step or an evaluation forward."""
    import torch
    import torch.nn.functional as F

    from fedsim.models import build_model

    torch.manual_seed(0)
    net = build_model("cnn4", 10, (3, 32, 32))
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    net.train(train)

    def once() -> None:
        if train:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        else:
            with torch.no_grad():
                net(x)

    for _ in range(3):  # warm-up
        once()
    t = time.perf_counter()
    for _ in range(calls):
        once()
    return (time.perf_counter() - t) / calls


def compute(args) -> None:
    """NCHW vs channels_last for the kernels alone, 1 torch thread, interleaved reps."""
    import torch

    torch.set_num_threads(1)
    print("cnn4, 1 thread, ms per call (median of interleaved reps)")
    print(f"  {'':26}{'NCHW':>8}{'channels_last':>15}{'speed-up':>10}")
    for label, batch, train, calls in COMPUTE_CASES:
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.reps):
            for channels_last in times:
                times[channels_last].append(seconds_per_call(channels_last, batch, train, calls))
        nchw, cl = median(times[False]), median(times[True])
        print(f"  {label:26}{1000 * nchw:>8.1f}{1000 * cl:>15.1f}{nchw / cl:>10.2f}")


# -- memory ----------------------------------------------------------------------------------------
def anon_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))


def memory_stages(n: int, trained: int, use_tracemalloc: bool, trim: bool, per_call: int) -> dict:
    """One worker core (worker 0 of 2: every other client) of the quickstart FedPer on n iid clients with
    5 train + 1 test images each, RssAnon after each stage. Runs in a fresh process (memory_child)."""
    import tracemalloc

    from fedsim.algorithms import WEIGHTS
    from fedsim.config import validate
    from fedsim.core.protocol import ClientData
    from fedsim.data import load_dataset, make_partition

    tree = quickstart({"data.partition": "iid", "data.num_clients": n,
                       "data.train_fraction": min(1.0, n * 5 / CIFAR_TRAIN),
                       "data.test_fraction": min(1.0, n / CIFAR_TEST)})
    cfg = validate(tree)
    data = load_dataset("cifar10")
    part = make_partition("iid", data.train_y, data.test_y, n, cfg.seed, train_fraction=cfg.data.train_fraction,
                          test_fraction=cfg.data.test_fraction)
    mine = {c: ClientData(part.train[c], part.test[c]) for c in range(0, n, 2)}
    out = {"n": n, "owned": len(mine), "per_call": per_call, "stages": {}}
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
    rt = worker_runtime(cfg, mine)
    mark("worker constructed")
    broadcast, owned = {WEIGHTS: rt.plan.model.initial["shared"]}, sorted(mine)
    sums = fixed_point_scales(rt, 5 * per_call)

    def train(clients: list[int], round_idx: int) -> None:
        # In chunks, as a Ray worker receives them (one call per round with its share of the sampled
        # clients); a call returns one exact partial sum, whatever the chunk size.
        for i in range(0, len(clients), per_call):
            rt.train_and_sum(broadcast, clients[i:i + per_call], round_idx, sums)

    train(owned[:trained], 1)
    mark(f"trained {trained}")
    rt.evaluate(broadcast, owned, 1)
    mark(f"evaluated all {len(owned)}")
    train(owned[trained:2 * trained], 2)
    mark(f"trained {trained} more")
    if use_tracemalloc:
        out["top"] = [str(s) for s in tracemalloc.take_snapshot().statistics("lineno")[:12]]
    personal = rt.slots["personal"]
    out["personal_vectors"] = len(personal)
    out["personal_bytes"] = int(sum(v.nbytes for _, v in personal.items()))
    out["index_bytes"] = int(sum(cd.train.nbytes + cd.test.nbytes for cd in mine.values()))
    return out


def memory_child(n: int, trained: int, per_call: int = 50, use_tracemalloc: bool = False,
                 trim: bool = False) -> dict | None:
    """memory_stages in a fresh 1-thread process (also used by scale.py); None if it failed (stderr logged)."""
    cmd = [sys.executable, __file__, "memory", "--child", str(n), "--trained", str(trained), "--per-call", str(per_call)]
    cmd += ["--tracemalloc"] * use_tracemalloc + ["--trim"] * trim
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if res.returncode:
        log(res.stderr[-3000:])
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def memory(args) -> None:
    if args.child:
        print(json.dumps(memory_stages(args.child, args.trained, args.tracemalloc, args.trim, args.per_call)))
        return
    rows = [memory_child(n, args.trained, args.per_call, args.tracemalloc, args.trim) for n in args.clients]
    if None in rows:
        raise SystemExit(1)
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


# -- fixedcost -------------------------------------------------------------------------------------
FIXED_CLIENTS = {"cnn4": 20, "mobilenet_v1": 6, "resnet34": 3}  # clients timed per call (a ResNet-34 step is seconds)
FIXED_PARTS = ("training_step", "load", "commit_model", "tensors", "stage", "add", "fits", "_keep", "client_generator",
               "_shared_version", "clear")  # functions whose cumulative time the breakdown reports


def fixed_cost_child(model: str, algorithm: str, clients: int, reps: int) -> dict:
    """One worker core (ClientRuntime, 1 thread) whose clients hold exactly one batch of 50 CIFAR-10 images and
    train one epoch: each client is one SGD step plus everything else a client costs (loading global and
    personal weights, optimizer resets, data, packing the upload, the exact sum). fixed = a client's time in train_and_sum outside training_step (timed in
    the same call, so the step's own noise does not enter it); step = one bare training_step on a batch of 50
    (the first step of a client also creates the optimizer's momentum buffers: counted as step, not fixed).
    Both are medians of interleaved reps in this process. A cProfile pass then says where the fixed part goes."""
    import cProfile
    import pstats

    import torch

    from fedsim.algorithms import PARTS, WEIGHTS
    from fedsim.config import validate
    from fedsim.core.protocol import ClientData
    from fedsim.data import load_dataset, make_partition

    n = 2 * clients * (reps + 2)  # fresh clients each call: nobody's personal part is loaded twice
    cfg = validate(quickstart({"algorithm": algorithm, "model.name": model, "data.partition": "iid",
                               "data.num_clients": n, "data.augment": False, "train.local_epochs": 1,
                               "data.train_fraction": n * 50 / CIFAR_TRAIN, "data.test_fraction": 0.1}))
    data = load_dataset("cifar10")
    part = make_partition("iid", data.train_y, data.test_y, n, cfg.seed, train_fraction=cfg.data.train_fraction,
                          test_fraction=cfg.data.test_fraction)
    rt = worker_runtime(cfg, {c: ClientData(part.train[c][:50], part.test[c]) for c in range(n)})
    broadcast = {WEIGHTS: rt.plan.model.initial["shared"]}
    plan = fixed_point_scales(rt, 50 * n)
    x, y = rt.client_tensors(0, "train")
    module = rt.loop.module if hasattr(rt, "loop") else rt.client_module  # (a baseline tree before the loop)
    queue = iter(range(n))
    in_steps: list[float] = []  # seconds inside training_step during the current timed call
    step_fn = module.training_step

    def timed_step(*a, **kw):
        t = time.perf_counter()
        out = step_fn(*a, **kw)
        in_steps.append(time.perf_counter() - t)
        return out

    module.training_step = timed_step  # the runtime reaches it through Fabric's wrapper, by attribute

    def clients_call() -> tuple[float, float]:
        """Seconds per client, and of those, outside training_step (the fixed cost, measured in the same call)."""
        batch = [next(queue) for _ in range(clients)]
        in_steps.clear()
        t = time.perf_counter()
        rt.train_and_sum(broadcast, batch, 1, plan)
        total = time.perf_counter() - t
        return total / clients, (total - sum(in_steps)) / clients

    baseline = not hasattr(rt, "loop")  # a tree before LocalLoop: its FedClient steps the optimizers the runtime activates

    def bare_step() -> float:
        module.train()
        if baseline:
            module.active_optimizers = [rt.optimizers["train"][p] for p in module.optimized_parts if p in PARTS["full"]]
        t = time.perf_counter()
        for _ in range(clients):
            step_fn((x, y), 0)
        if baseline:
            module.active_optimizers = []
        return (time.perf_counter() - t) / clients

    clients_call(), bare_step()  # warm-up
    per_client, fixed, step_s = [], [], []
    for _ in range(reps):
        c, f = clients_call()
        per_client.append(c)
        fixed.append(f)
        step_s.append(bare_step())
    profiler = cProfile.Profile()
    profiler.runcall(clients_call)
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, prim calls, tottime, cumtime, callers)
    total = sum(tt for _, _, tt, _, _ in stats.values())
    parts = collections.defaultdict(float)
    for (_, _, name), (_, _, _, cum, _) in stats.items():
        if name in FIXED_PARTS:
            parts[name] += cum
    return {"model": model, "algorithm": algorithm, "clients_per_call": clients, "reps": reps,
            "client_s": median(per_client), "step_s": median(step_s),
            "fixed_s": median(fixed), "shared_values": rt.plan.model.layouts["shared"].size,
            "profile_total_s": total, "profile_s": dict(parts), "threads": torch.get_num_threads(),
            "fedsim": sys.modules["fedsim"].__file__}


def fixedcost(args) -> None:
    if args.child:
        print(json.dumps(fixed_cost_child(args.child, args.algorithm, args.clients or FIXED_CLIENTS[args.child],
                                          args.reps)))
        return
    trees = {"this tree": str(REPO)} | ({"baseline": args.baseline} if args.baseline else {})
    rows: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for _ in range(args.rounds):  # trees interleaved, each model in a fresh 1-thread process
        for model in args.models:
            for label, tree in trees.items():
                cmd = [sys.executable, __file__, "fixedcost", "--child", model, "--algorithm", args.algorithm,
                       "--reps", str(args.reps)] + (["--clients", str(args.clients)] if args.clients else [])
                env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode:
                    log(res.stderr[-3000:])
                    raise SystemExit(1)
                rows[model, label].append(json.loads(res.stdout.strip().splitlines()[-1]))
                r = rows[model, label][-1]
                log(f"  {model} {label}: client {1000 * r['client_s']:.1f} ms, step {1000 * r['step_s']:.1f} ms, "
                    f"load avg {os.getloadavg()[0]:.2f}")
    print(f"per-client fixed cost vs one SGD step (batch 50), {args.algorithm}, 1 thread, CPU; "
          f"medians of {args.rounds} processes x {args.reps} reps")
    for (model, label), rs in rows.items():
        step_ms, fixed_ms = 1000 * median([r["step_s"] for r in rs]), 1000 * median([r["fixed_s"] for r in rs])
        prof = rs[-1]["profile_s"]
        where = ", ".join(f"{k} {1000 * v / rs[-1]['clients_per_call']:.1f}" for k, v in
                          sorted(prof.items(), key=lambda kv: -kv[1]))
        print(f"  {model:<13}{label:<10} step {step_ms:8.1f} ms  fixed {fixed_ms:7.1f} ms  "
              f"RATIO fixed/step {fixed_ms / step_ms:.3f}")
        print(f"      cProfile ms per client (cumulative): {where}")
    save("fixedcost", {"args": vars(args), "machine": machine(), "rows": {f"{m} | {l}": rs for (m, l), rs in rows.items()}})


# -- aggmem ----------------------------------------------------------------------------------------
def aggmem(args) -> None:
    """The server's aggregation (FedAvg) of W int64 partials of a model's size, under tracemalloc: folding each
    into the round's totals (``RoundSums.add``) and ``SumReduction.update`` (means and the server hook, tensor by
    tensor); its transient heap, by line, next to the partials' own bytes. No Ray: the partials are made before
    tracing starts (in a run they are views into the object store, released as they are folded), and nothing
    is published (``ray.put`` writes one float32 copy into the store, whose pages the server then releases)."""
    import tracemalloc
    import types

    import numpy as np

    from fedsim.algorithms import WEIGHTS, build_algorithm
    from fedsim.config import validate
    from fedsim.core.aggregate import FixedPoint, RoundSums
    from fedsim.core.protocol import FixedPointScales, WorkerPartial
    from fedsim.engine.reduction import SumReduction
    from fedsim.plan.build import build_model_plan
    from fedsim.privacy.mechanism import ServerPrivacy

    cfg = validate(quickstart({"algorithm": "fedavg", "model.name": args.model}))
    model = build_model_plan(cfg, build_algorithm(cfg), 10, (3, 32, 32))
    layout, initial = model.layouts["shared"], model.initial["shared"]
    plan = FixedPointScales({WEIGHTS: FixedPoint.plan(initial, layout.offsets, 3 * args.sampled)}, {WEIGHTS: False})
    rng = np.random.default_rng(0)
    partials = [WorkerPartial([], {WEIGHTS: rng.integers(-2 ** 40, 2 ** 40, layout.size)}, {WEIGHTS: 3 * args.sampled})
                for _ in range(args.workers)]
    reduction = SumReduction.__new__(SumReduction)  # a synchronous round's, without a plan or Ray
    reduction.plan, reduction.algorithm = types.SimpleNamespace(num_clients=10_000), build_algorithm(cfg)
    reduction.tensor_offsets, reduction.shared_size = layout.offsets, layout.size
    reduction.state = types.SimpleNamespace(values={WEIGHTS: initial}, privacy=ServerPrivacy(None))
    tracemalloc.start()
    sums = RoundSums(plan.scales, layout.size)
    for partial in partials:
        sums.add(partial.sums, partial.weights)
    reduction.scaling, reduction.sums = plan, sums
    reduction.update(1, [None] * args.sampled, None)  # kept: only counted
    peak = tracemalloc.get_traced_memory()[1]
    top = tracemalloc.take_snapshot().statistics("lineno")[:5]
    tracemalloc.stop()
    mb = 4 * layout.size / 2 ** 20
    print(f"{args.model}: model {mb:.1f} MB (float32); W = {args.workers} int64 partials {args.workers * 2 * mb:.1f} MB "
          f"(= 2 x W x model bytes); aggregation's own peak heap {peak / 2 ** 20:.1f} MB = {peak / 2 ** 20 / mb:.2f} "
          f"model sizes; largest tensor {np.diff(layout.offsets).max() / layout.size:.1%} of the model")
    for stat in top:
        print("   still held after:", stat)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("startup", help="start-up timeline of one short quickstart run")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trace", default="/tmp/fedsim-timeline.json", help="chrome://tracing file of the Ray events")
    p.add_argument("--set", nargs="*", default=[], help="dotted key=value config overrides")
    p.set_defaults(fn=startup)
    p = sub.add_parser("spawn", help="ray.init, actor spawn variants, ray.shutdown")
    p.add_argument("--reps", type=int, default=3)
    p.set_defaults(fn=spawn)
    p = sub.add_parser("pyspy", help="py-spy on the worker and server actors during steady rounds")
    p.add_argument("--preset", default="device", choices=["quickstart", "device", "scale"])
    p.add_argument("--set", nargs="*", default=[], help="dotted key=value config overrides")
    p.add_argument("--skip", type=int, default=1, help="start profiling when this round has finished")
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--top", type=int, default=28)
    p.add_argument("--out", default="/tmp/fedsim-pyspy", help="raw py-spy files, for speedscope or flamegraphs")
    p.set_defaults(fn=pyspy)
    p = sub.add_parser("step", help="one client's training: worker core vs a plain loop")
    p.add_argument("--samples", type=int, default=5000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--algorithm", default="fedavg")
    p.set_defaults(fn=step)
    p = sub.add_parser("compute", help="NCHW vs channels_last for the cnn4 kernels alone")
    p.add_argument("--reps", type=int, default=5)
    p.set_defaults(fn=compute)
    p = sub.add_parser("memory", help="the worker core's memory by stage")
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--trained", type=int, default=200)
    p.add_argument("--per-call", type=int, default=50, help="clients per train call (a worker's share of a "
                   "round: 50 = 100 sampled clients over 2 workers)")
    p.add_argument("--tracemalloc", action="store_true")
    p.add_argument("--trim", action="store_true", help="also report RssAnon after malloc_trim(0)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.set_defaults(fn=memory)
    p = sub.add_parser("fixedcost", help="per-client fixed cost vs one SGD step, per model (this tree vs --baseline)")
    p.add_argument("--models", nargs="+", default=list(FIXED_CLIENTS))
    p.add_argument("--algorithm", default="fedavg", help="fedavg uploads the whole model: the largest pack and sum")
    p.add_argument("--clients", type=int, default=None, help="clients per timed call (default: per model)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="fresh processes per (model, tree)")
    p.add_argument("--baseline", help="another checkout of fedsim (e.g. a git worktree of main) run the same way")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.set_defaults(fn=fixedcost)
    p = sub.add_parser("aggmem", help="the server's transient memory while it aggregates W partials (tracemalloc)")
    p.add_argument("--model", default="resnet34")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sampled", type=int, default=100)
    p.set_defaults(fn=aggmem)
    p = sub.add_parser("smoke", help="step, compute and aggmem on tiny sizes, in seconds: checks that they run "
                       "(tests/test_benchmarks.py); the Ray-based profiles (startup, spawn, pyspy) and the fresh-process "
                       "ones (memory, fixedcost) are left to their own runs")
    p.set_defaults(fn=smoke)
    return ap


def smoke(args) -> None:
    for fn, sizes in ((step, {"samples": 100, "epochs": 1, "reps": 1, "algorithm": "fedavg"}), (compute, {"reps": 1}),
                      (aggmem, {"model": "cnn4", "workers": 2, "sampled": 4})):
        fn(argparse.Namespace(**sizes))


if __name__ == "__main__":
    args = parser().parse_args()
    args.fn(args)
