"""GPU readiness on one GPU (run through benchmarks/gpu_check.sh): throughput of 4 workers at 0.25 GPU each
against 1 worker, GPU utilisation, determinism on CUDA, a paper-scale slice of FedBABU, and packed training.

Runs, in this order (each a real `fedsim` run through Ray, in a fresh temporary folder; --parts picks):
  quickstart x 4 workers, x 1 worker, x 4 workers again   (cnn4, CIFAR-10, FedPer)
  paper slice x 4 workers, x 1 worker                      (fedsim/reproduce/configs/paper/fedbabu_mobilenet_cifar100.yaml)
  packed: the cross-device workload (pfl-research's clients: 50 CIFAR-10 images each, batch 10, 1 epoch, FedAvg,
          cnn4; 100 clients of the subset, cohort 50) sequential and packed (engine.pack: auto) on 1 worker and on
          4 workers x 0.25 GPU, and packed with engine.pack: 8 on 4 workers: client-steps/s, GPU utilisation, and
          whether packed runs are bit-identical on CUDA for 1 and 4 workers and pack sizes auto and 8
Throughput counts sample-steps (images x local epochs, exact from `fedsim run --dry-run`'s estimate) over
the steady rounds: the first (start-up) and the last (evaluation) are left out. Determinism compares every
per-client record of metrics.jsonl between the runs of one workload. The paper slice keeps the paper's
per-round work, 10 sampled clients of 500 images x tau = 4 epochs at batch 50, on 10 clients of the CIFAR-100
subset (benchmarks/gpu_subset.py) with f = 1, and ends with FedBABU's fine-tuning evaluation (5 epochs).
Writes gpu_check.json to --out; a run that does not fit the time left is skipped and named in it."""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedsim.config import RunConfig, load_tree, validate  # noqa: E402
from fedsim.engine.estimate import estimate  # noqa: E402

PAPER = ROOT / "fedsim" / "reproduce" / "configs" / "paper" / "fedbabu_mobilenet_cifar100.yaml"
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"


class GpuSampler:
    """nvidia-smi every 200 ms in the background: (time, utilisation %, memory MiB); absent on a CPU machine."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                          "--format=csv,noheader,nounits", "-lms", "200"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                util, mem = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue  # a header or a "[N/A]"
            self.samples.append((time.time(), util, mem))

    def window(self, start: float, end: float) -> dict | None:
        inside = [(u, m) for t, u, m in self.samples if start <= t <= end]
        if not inside:
            return None
        return {"util_mean_pct": round(sum(u for u, _ in inside) / len(inside), 1),
                "util_max_pct": max(u for u, _ in inside), "mem_max_mib": max(m for _, m in inside),
                "samples": len(inside)}

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@dataclass
class Measured:
    """One run: when each round ended, its server-side seconds, and the run folder's per-client records."""
    name: str
    workers: int
    started: float
    devices: list[str] = field(default_factory=list)  # what the workers trained on (cuda:0 or cpu)
    round_ends: list[float] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    wall_s: float = 0.0


def run_measured(key: str, cfg: RunConfig) -> Measured:
    import ray

    from fedsim.engine.driver import Callback
    from fedsim.simulate import run

    m = Measured(key, cfg.engine.workers, time.time())

    class EachRound(Callback):
        def on_round_end(self, run, result) -> None:
            m.round_ends.append(time.time())
            m.round_seconds.append(result.seconds)

    try:
        result = run(cfg, overwrite=True, callbacks=[EachRound()])
    finally:
        ray.shutdown()  # each run starts its own Ray, sized for its workers
    m.wall_s = time.time() - m.started
    m.devices = sorted({w["device"] for w in result.summary["workers"]})
    m.records = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return m


def steady(m: Measured, cfg: RunConfig, sampler: GpuSampler) -> dict:
    """Throughput over rounds 2 .. R-1 (f = 1, so every round trains the same clients and work)."""
    e = estimate(cfg)
    rounds = len(m.round_ends) - 2
    seconds = m.round_ends[-2] - m.round_ends[0]
    per_round = e.train_sample_steps // e.rounds
    return {"steady_rounds": rounds, "steady_s": round(seconds, 3),
            "sample_steps_per_s": round(rounds * per_round / seconds, 1),
            "sgd_steps_per_s": round(rounds * (e.train_sgd_steps // e.rounds) / seconds, 2),
            "gpu": sampler.window(m.round_ends[0], m.round_ends[-2])}


def same_records(a: Measured, b: Measured) -> dict:
    """Bit-for-bit equality of every per-client record (losses and accuracies as logged, full precision)."""
    differing = [(x["round"], x["client"]) for x, y in zip(a.records, b.records) if x != y]
    return {"runs": [f"{a.name} ({a.workers} workers)", f"{b.name} ({b.workers} workers)"],
            "records": len(a.records), "identical": not differing and len(a.records) == len(b.records),
            "first_difference": differing[0] if differing else None}


# --cpu: the script's own test on a CPU machine, so each run is cut to seconds.
CPU_CUT = ["data.train_fraction=0.1", "data.test_fraction=0.5", "train.local_epochs=1", "eval.finetune_epochs=1"]


def workload(path: Path, name: str, out: Path, workers: int, gpu: float, overrides: list[str]) -> RunConfig:
    """One config of ``path`` without its sweep, on ``workers`` workers of ``gpu`` GPU each."""
    tree = load_tree(path, overrides + (CPU_CUT if not gpu else []))
    tree.pop("sweep", None)
    tree.update(name=f"{name}-w{workers}", out_dir=str(out))
    engine = {"workers": workers, "gpus_per_worker": gpu, "cpus_per_worker": 1 if gpu else 0.5,
              "threads_per_worker": 1}
    tree["engine"] = {**tree.get("engine", {}), **engine}
    return validate(tree)


def quickstart(out: Path, workers: int, gpu: float, rounds: int) -> RunConfig:
    # The subset holds the quickstart's own 10% / 20% cut, so fractions go to 1; FedPer, as in its sweep.
    return workload(QUICKSTART, "quickstart", out, workers, gpu,
                    ["algorithm=fedper", "data.train_fraction=1.0", "data.test_fraction=1.0",
                     f"train.rounds={rounds}", f"train.eval_every={rounds}"])


def paper_slice(out: Path, workers: int, gpu: float, rounds: int) -> RunConfig:
    # 10 clients at f = 1: the paper's 10 sampled clients of 500 images per round (s = 10 shards of 50).
    return workload(PAPER, "paper-slice", out, workers, gpu,
                    ["algorithm.name=fedbabu", "data.num_clients=10", "train.fraction=1.0",
                     f"train.rounds={rounds}", f"train.eval_every={rounds}"])


def crossdevice(out: Path, workers: int, gpu: float, rounds: int, pack: int | str) -> RunConfig:
    """pfl-research's cross-device clients on the CIFAR-10 subset: 100 clients x 50 images, cohort 50."""
    sgd = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4}
    tree = {"name": f"xdev-pack{pack}-w{workers}", "seed": 0, "algorithm": "fedavg", "out_dir": str(out),
            "data": {"dataset": "cifar10", "num_clients": 100, "partition": "iid", "augment": True,
                     "train_fraction": 1.0, "test_fraction": 1.0 if gpu else 0.2},
            "model": {"name": "cnn4"},
            "train": {"rounds": rounds, "local_epochs": 1, "batch_size": 10, "fraction": 0.5,
                      "eval_every": rounds, "body": sgd, "head": sgd},
            "eval": {"finetune_epochs": 0},
            "engine": {"workers": workers, "gpus_per_worker": gpu, "cpus_per_worker": 1 if gpu else 0.5,
                       "threads_per_worker": 1, "pack": pack}}
    return validate(tree)


def packed_report(throughput: dict) -> dict:
    """Packed over sequential client-steps/s on 1 and 4 workers (target: >= 10 on one GPU, issue 27)."""
    out = {}
    for workers in (1, 4):
        seq, packed = throughput.get(f"xdev-seq-w{workers}"), throughput.get(f"xdev-packed-w{workers}")
        if seq and packed:
            out[f"packed-vs-sequential-w{workers}"] = round(packed["sgd_steps_per_s"] / seq["sgd_steps_per_s"], 2)
    return out


def slice_report(m: Measured, cfg: RunConfig) -> dict:
    """Seconds per training round and for the final round (training + fine-tuning evaluation)."""
    train = m.round_seconds[1:-1]
    accs = [r["acc_personalized"] for r in m.records if "acc_personalized" in r]
    return {"rounds": cfg.train.rounds, "round_s": [round(s, 3) for s in m.round_seconds],
            "train_round_s_mean": round(sum(train) / len(train), 3),
            "final_round_with_finetune_eval_s": round(m.round_seconds[-1], 3), "wall_s": round(m.wall_s, 1),
            "initial_acc_mean": round(sum(r["acc"] for r in m.records) / len(m.records), 4),
            "personalized_acc_mean": round(sum(accs) / len(accs), 4) if accs else None}


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.time() + seconds

    def allows(self, seconds: float) -> bool:
        return time.time() + seconds < self.end


def summarize(runs: dict[str, tuple[Measured, RunConfig]], sampler: GpuSampler) -> dict:
    """Throughput (with the 4-vs-1 speed-up), determinism and the paper slice from the runs done so far."""
    throughput = {k: steady(m, cfg, sampler) for k, (m, cfg) in runs.items()}
    for name in ("quickstart", "paper"):
        one, four = throughput.get(f"{name}-w1"), throughput.get(f"{name}-w4")
        if one and four:
            throughput[f"{name}-speedup-4-vs-1"] = round(four["sample_steps_per_s"] / one["sample_steps_per_s"], 2)
    pairs = [("quickstart-w4", "quickstart-w4-again"), ("quickstart-w4", "quickstart-w1"), ("paper-w4", "paper-w1"),
             ("xdev-packed-w1", "xdev-packed-w4"), ("xdev-packed-w4", "xdev-pack8-w4"), ("xdev-seq-w1", "xdev-seq-w4")]
    return {"throughput": throughput, "packed": packed_report(throughput),
            "determinism": [same_records(runs[a][0], runs[b][0]) for a, b in pairs if a in runs and b in runs],
            "paper_slice": {k: slice_report(*runs[k]) for k in ("paper-w4", "paper-w1") if k in runs},
            "devices": {k: m.devices for k, (m, _) in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true", help="no GPU: tiny rounds, to test the script itself")
    parser.add_argument("--budget-s", type=float, default=500, help="skip a run that would not end in time")
    parser.add_argument("--parts", default="quickstart,paper,packed", help="comma-separated: quickstart, paper, packed")
    args = parser.parse_args()
    import torch

    gpu = 0.0 if args.cpu else 0.25
    q_rounds, p_rounds = (3, 3) if args.cpu else (8, 10)
    head = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
            "torch": torch.__version__, "device": "cpu" if args.cpu else torch.cuda.get_device_name(0),
            "gpus_per_worker": gpu, "skipped": []}
    sampler, deadline = GpuSampler(), Deadline(args.budget_s)
    runs: dict[str, tuple[Measured, RunConfig]] = {}
    x_rounds = 3 if args.cpu else 6

    def xdev(pack):
        return lambda out, workers, gpu, rounds: crossdevice(out, workers, gpu, rounds, pack)

    plan = [("quickstart", "quickstart-w4", quickstart, 4, q_rounds, 60),
            ("quickstart", "quickstart-w1", quickstart, 1, q_rounds, 60),
            ("quickstart", "quickstart-w4-again", quickstart, 4, q_rounds, 60),
            ("paper", "paper-w4", paper_slice, 4, p_rounds, 120), ("paper", "paper-w1", paper_slice, 1, p_rounds, 150),
            ("packed", "xdev-packed-w4", xdev("auto"), 4, x_rounds, 60),
            ("packed", "xdev-seq-w4", xdev(1), 4, x_rounds, 60),
            ("packed", "xdev-packed-w1", xdev("auto"), 1, x_rounds, 60),
            ("packed", "xdev-seq-w1", xdev(1), 1, x_rounds, 90),
            ("packed", "xdev-pack8-w4", xdev(8), 4, x_rounds, 60)]
    parts = set(args.parts.split(","))
    plan = [(key, build, workers, rounds, needs_s) for part, key, build, workers, rounds, needs_s in plan if part in parts]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fedsim-gpu-check-") as tmp:
        for key, build, workers, rounds, needs_s in plan:
            if not deadline.allows(needs_s):
                head["skipped"].append(key)
                continue
            cfg = build(Path(tmp, key), workers, gpu, rounds)
            m = run_measured(key, cfg)
            runs[key] = (m, cfg)
            print(f"{key}: {m.wall_s:.1f} s, rounds {[round(s, 2) for s in m.round_seconds]}, on {m.devices}", flush=True)
            # Written after every run: a check stopped by its time limit still leaves what it measured.
            (args.out / "gpu_check.json").write_text(json.dumps({**head, **summarize(runs, sampler)}, indent=1))
    sampler.stop()
    (args.out / "gpu_check.json").write_text(json.dumps({**head, **summarize(runs, sampler)}, indent=1))
    print((args.out / "gpu_check.json").read_text())


if __name__ == "__main__":
    main()
