"""Shared helpers for the benchmark scripts (not part of the fedsim package).

Every script measures RATIOS inside one process, interleaving repetitions (A, B, A, B, ...) and
taking medians, because the 2-core machine is shared and absolute seconds drift with its load.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import fedsim  # noqa: F401  (first: it sets Ray's local-cluster env, token auth and loopback, which Ray reads on import)
from fedsim.config import set_dotted

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
RESULTS = BENCH / "results"  # gitignored; each script leaves a JSON of its raw measurements here

os.environ.setdefault("FEDSIM_DATA", str(REPO.parent / "shared" / "datasets"))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# experiments/quickstart.yaml, FedPer variant (kept here so the benchmark does not change when the
# experiment file is edited; overhead.py checks that they still agree).
QUICKSTART = {
    "name": "bench-quickstart",
    "seed": 0,
    "algorithm": "fedper",
    "out_dir": "/tmp/fedsim-bench-runs",
    "data": {"dataset": "cifar10", "num_clients": 10, "partition": "classes", "k": 4,
             "train_fraction": 0.1, "test_fraction": 0.2, "augment": True},
    "model": {"name": "cnn4", "personal_layers": 1},
    "train": {"rounds": 3, "local_epochs": 4, "batch_size": 50, "fraction": 1.0, "eval_every": 1,
              "body": {"lr": 0.01, "momentum": 0.9, "weight_decay": 5.0e-4},
              "head": {"lr": 0.01, "momentum": 0.9, "weight_decay": 5.0e-4}},
    "eval": {"finetune_epochs": 0},
    "engine": {"workers": 2, "cpus_per_worker": 1, "threads_per_worker": 1},
}


# --smoke: the script's own code on tiny sizes, in seconds, as tests/test_benchmarks.py runs it (``make test``) so
# that no script rots unnoticed; its numbers mean nothing. The quickstart keeps its 10 clients and 4 classes each,
# with 2% of its images and one local epoch.
SMOKE = False
SMOKE_SIZES = {"data.train_fraction": 0.02, "data.test_fraction": 0.02, "train.local_epochs": 1}
SMOKE_OVERRIDES = [f"{key}={value}" for key, value in SMOKE_SIZES.items()]  # the same, as `fedsim run` arguments


def parse(ap: argparse.ArgumentParser, **tiny) -> argparse.Namespace:
    """``ap``'s arguments, with a ``--smoke`` flag: given, ``tiny``'s values replace the parsed ones, ``quickstart()``
    shrinks to SMOKE_SIZES and nothing waits for a quiet machine."""
    global SMOKE
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: checks that the script runs "
                    "(tests/test_benchmarks.py); its numbers mean nothing")
    args = ap.parse_args()
    if args.smoke:
        SMOKE = True
        vars(args).update(tiny)
    return args


def quickstart(overrides: dict | None = None) -> dict:
    """A deep copy of the quickstart FedPer tree with dotted-key overrides applied (on SMOKE_SIZES under --smoke)."""
    tree = smoke_sized(copy.deepcopy(QUICKSTART))
    for dotted, value in (overrides or {}).items():
        set_dotted(tree, dotted, value)
    return tree


def smoke_sized(tree: dict) -> dict:
    """``tree`` cut to SMOKE_SIZES under --smoke (in place), as it is otherwise."""
    for dotted, value in (SMOKE_SIZES if SMOKE else {}).items():
        set_dotted(tree, dotted, value)
    return tree


def run_fedsim(tree: dict, callbacks: tuple = ()) -> dict:
    """fedsim end to end in this process, the way a user's script calls it: fedsim.simulate.run (data,
    partition, ray.init, server + worker actors, rounds, files) and ray.shutdown. Returns timings and the
    summary; ``callbacks`` (the driver loop's) are told of the run after the one that stamps each round.

    round_s: the server actor's own per-round clock (rounds.jsonl "seconds": sample, train, average, evaluate);
    period_s: time between the entrypoint's per-round callbacks (adds checkpointing and logging)."""
    import ray

    from fedsim.config import validate

    cfg = validate(tree)
    stamps: list[float] = []
    t0 = time.perf_counter()
    result = _run(cfg, lambda: stamps.append(time.perf_counter()), callbacks)
    t_run = time.perf_counter() - t0
    ray.shutdown()
    t_all = time.perf_counter() - t0
    rounds = [json.loads(line) for line in (result.run_dir / "rounds.jsonl").read_text().splitlines()]
    return {"end_to_end_s": t_all, "run_s": t_run, "shutdown_s": t_all - t_run,
            "wall_seconds": result.summary["wall_seconds"],  # fedsim's own clock: actors + rounds, no ray.init
            "round_s": [r["seconds"] for r in rounds], "period_s": [b - a for a, b in zip(stamps, stamps[1:])],
            "first_round_done_s": stamps[0] - t0 if stamps else float("nan"),
            "summary": result.summary, "run_dir": str(result.run_dir)}


def _run(cfg, stamp, callbacks: tuple):
    """fedsim's run with ``stamp()`` called after every round. population.py also times the engine of commit
    dae5d9e (its checkout on PYTHONPATH), which had no callbacks yet: there a round hook stands in."""
    try:
        from fedsim.engine.driver import Callback
        from fedsim.simulate import run
    except ImportError:
        from fedsim.engine import run

        assert not callbacks, "the old engine takes no callbacks"
        return run(cfg, overwrite=True, on_round=lambda row, result: stamp())

    class Stamps(Callback):
        def on_round_end(self, run, result) -> None:
            stamp()

    return run(cfg, overwrite=True, callbacks=[Stamps(), *callbacks])


def worker_runtime(cfg, clients: dict | None = None):
    """A worker's ClientRuntime for ``cfg``, built as the engine builds one (from the run's plan), hosting
    ``clients`` (client -> ClientData; default: every client of the config's partition)."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.plan.build import build_plan, load_inputs

    plan = build_plan(cfg, load_inputs(cfg))
    return ClientRuntime(plan.for_workers(), dict(enumerate(plan.clients)) if clients is None else clients)


def fixed_point_scales(rt, total_weight: int):
    """The FixedPointScales the server fixes before a round (every upload scaled from the round-0 weights)."""
    from fedsim.core.aggregate import FixedPoint
    from fedsim.core.protocol import FixedPointScales

    model = rt.plan.model
    scale = FixedPoint.plan(model.initial["shared"], model.layouts["shared"].offsets, total_weight)
    return FixedPointScales({name: scale for name in rt.algorithm.uploads},
                            {name: (w or rt.cfg.train.weighting) == "uniform" for name, w in rt.algorithm.uploads.items()})


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def machine() -> dict:
    import numpy
    import torch

    info = {"date": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "numpy": numpy.__version__, "load_avg": os.getloadavg()}
    for mod in ("ray", "pytorch_lightning"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return info


def save(name: str, payload: dict) -> Path:
    """``payload`` as ``results/<name>-<time>.json``; under --smoke into a temporary folder instead: a smoke run's
    numbers mean nothing, and never sit beside measurements (``overhead.py --only-same-work`` reads them back)."""
    folder = Path(tempfile.gettempdir()) / "fedsim-benchmark-smoke" if SMOKE else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def check_quickstart() -> None:
    """Warn when experiments/quickstart.yaml drifted from the copy benchmarked here."""
    import yaml

    tree = yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())
    for section in ("data", "model", "eval", "engine"):
        if tree.get(section) != QUICKSTART[section]:
            log(f"WARNING: experiments/quickstart.yaml {section} differs from benchmarks/_common.py QUICKSTART")
    mine = {k: v for k, v in QUICKSTART["train"].items() if k not in ("rounds", "eval_every")}
    if {k: v for k, v in tree["train"].items() if k != "rounds"} != mine:
        log("WARNING: experiments/quickstart.yaml train differs from benchmarks/_common.py QUICKSTART")


def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks used so far) for every process on the machine, from /proc."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime+stime
        except (OSError, IndexError, ValueError):
            pass  # the process exited while we read it
    return out


def process_tree(table: dict[int, tuple[int, int]], root: int) -> set[int]:
    """``root`` and every process below it in ``table`` (Ray's raylet and workers descend from the
    process that called ray.init)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), [root]
    while stack:
        p = stack.pop()
        out.add(p)
        stack.extend(children.get(p, []))
    return out


def descendants(root: int | None = None) -> set[int]:
    return process_tree(proc_table(), root or os.getpid())


class Periodic:
    """Calls the subclass's ``sample()`` on a background thread, at once and then every ``interval`` s,
    for as long as the ``with`` block runs."""

    def __init__(self, interval: float):
        import threading

        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class CpuMeter(Periodic):
    """Samples, every `interval` s, how many CPU cores this process tree and everything else kept busy.

    The machine is shared: a rep that ran while another engineer's job used a core is not comparable
    to one that did not, so each measurement carries `others_cores` (mean cores busy outside this tree).
    """

    def __init__(self, interval: float = 2.0):
        super().__init__(interval)
        self.samples: list[tuple[float, float]] = []
        self._hz = os.sysconf("SC_CLK_TCK")
        self._prev: tuple[dict[int, tuple[int, int]], float] | None = None

    def sample(self) -> None:
        cur, t = proc_table(), time.monotonic()
        if self._prev is not None:
            prev, t_prev = self._prev
            mine = process_tree(cur, os.getpid())
            mine_j = others_j = 0
            for pid, (_, ticks) in cur.items():
                if pid not in prev:
                    continue  # started within the interval: its share is unknown, skip it
                delta = ticks - prev[pid][1]
                if pid in mine:
                    mine_j += delta
                else:
                    others_j += delta
            dt = (t - t_prev) * self._hz
            self.samples.append((mine_j / dt, others_j / dt))
        self._prev = cur, t

    @property
    def mine_cores(self) -> float:
        return statistics.fmean(s[0] for s in self.samples) if self.samples else float("nan")

    @property
    def others_cores(self) -> float:
        return statistics.fmean(s[1] for s in self.samples) if self.samples else float("nan")


QUIET_CORES = float(os.environ.get("BENCH_QUIET_CORES", "0.3"))
QUIET_WAIT_S = float(os.environ.get("BENCH_QUIET_WAIT_S", "180"))
# A rep during which other processes kept fewer cores busy than this counts as quiet; reports then
# also give the medians over the quiet reps alone.
QUIET_REP_CORES = 0.25


def wait_quiet(threshold: float = QUIET_CORES, max_wait: float = QUIET_WAIT_S, window: float = 4.0) -> float:
    """Wait (up to max_wait s) until other processes used < threshold cores over a window; returns the wait (none
    under --smoke)."""
    if SMOKE:
        return 0.0
    t0 = time.perf_counter()
    while True:
        with CpuMeter(interval=window / 2) as meter:
            time.sleep(window + 0.1)
        if meter.others_cores < threshold or time.perf_counter() - t0 > max_wait:
            return time.perf_counter() - t0


def measured(fn, *args, **kwargs) -> dict:
    """fn(*args) -> dict, plus the CPU cores this tree and other processes used while it ran.
    Waits first for the shared machine to be quiet (BENCH_QUIET_CORES, BENCH_QUIET_WAIT_S)."""
    waited = wait_quiet()
    with CpuMeter() as meter:
        out = fn(*args, **kwargs)
    out["mine_cores"], out["others_cores"], out["waited_s"] = meter.mine_cores, meter.others_cores, waited
    return out


def proc_memory(pid: int) -> dict | None:
    """kB figures from /proc/<pid>/status: VmHWM (peak RSS), VmRSS, RssAnon (private heap etc.),
    RssFile (file-backed pages, e.g. the memory-mapped data set and shared libraries)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    kb = {k: int(fields[k].split()[0]) for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile") if k in fields}
    return {"cmd": cmd[:80], **kb}


class MemorySampler(Periodic):
    """Polls the memory of every process in this process tree until stopped; keeps per-pid peaks and
    last values."""

    def __init__(self, interval: float = 0.5):
        super().__init__(interval)
        self.stats: dict[int, dict] = {}

    def sample(self) -> None:
        for pid in descendants():
            m = proc_memory(pid)
            if not m:
                continue
            s = self.stats.setdefault(pid, {"cmd": m["cmd"], "peak_hwm_kb": 0, "peak_anon_kb": 0})
            if m["cmd"].startswith("ray::"):  # Ray renames an actor's process once it hosts the actor
                s["cmd"] = m["cmd"]
            s["peak_hwm_kb"] = max(s["peak_hwm_kb"], m.get("VmHWM", 0))
            s["peak_anon_kb"] = max(s["peak_anon_kb"], m.get("RssAnon", 0))
            if "RssAnon" in m:  # an exiting process reports no memory lines
                s["last"] = m
