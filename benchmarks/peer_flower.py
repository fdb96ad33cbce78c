"""fedsim vs Flower's simulation engine on two FedAvg workloads (same CNN, same data, same SGD).

  cross-silo    10 clients x 5,000 CIFAR-10 images (iid), all 10 train every round, e=1, b=50
  cross-device  1,000 clients x 50 images (iid), 100 sampled per round, e=1, b=50

Both: fedsim's cnn4, SGD lr 0.01 / momentum 0.9 / wd 5e-4, crop+flip augmentation, 2 workers
(fedsim: 2 actors x 1 thread; Flower: Ray backend, 1 CPU per actor -> 2 actors, 1 torch thread
each), every client evaluated once, in the last round (fedsim: eval_every > rounds; Flower: a
FedAvg subclass that skips federated evaluation before the last round). Per-round figures are the
training phase of a round (sample, dispatch, local SGD, collect, average), median over rounds 2..R
(fedsim: the server's clock of the rounds without evaluation; Flower: FedAvg.configure_train ->
aggregate_train; round 1 is skipped because Flower starts Ray and its actors inside it); end to end
is the framework call: fedsim.simulate.run + ray.shutdown, flwr.simulation.run_simulation.

Flower lives in its own venv (it pins ray 2.55.1): benchmarks/.venv-flwr is created on first use
(python3 -m venv; pip install 'flwr[simulation]' torch==2.14.1 torchvision==0.29.1) and runs
benchmarks/_flower_app.py as a subprocess with PYTHONPATH=repo root for fedsim's model and
augmentation code. fedsim exports each partition (client -> sample indices into the decoded
CIFAR-10 cache, which both sides memory-map) to /tmp/fedsim-bench-flower/<workload>.npz.

    .venv/bin/python benchmarks/peer_flower.py                      # both workloads: ~6 min on a quiet box
    .venv/bin/python benchmarks/peer_flower.py --workloads device   # ~3 min
    .venv/bin/python benchmarks/peer_flower.py --workloads device --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from _common import BENCH, QUIET_REP_CORES, REPO, log, machine, measured, median, run_fedsim, save

FLWR_VENV = BENCH / ".venv-flwr"
FLWR_PY = FLWR_VENV / "bin" / "python"
EXPORT = Path("/tmp/fedsim-bench-flower")
FLOWER_TIMEOUT_S = float(os.environ.get("BENCH_FLOWER_TIMEOUT_S", "900"))

WORKLOADS = {
    "silo": {"num_clients": 10, "fraction": 1.0, "rounds": 2},
    "device": {"num_clients": 1000, "fraction": 0.1, "rounds": 3},
}
HP = {"seed": 0, "local_epochs": 1, "batch_size": 50, "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4,
      "augment": True, "cpus": 2, "memory_format": "auto"}


def ensure_flower_venv() -> None:
    ok = FLWR_PY.exists() and subprocess.run([str(FLWR_PY), "-c", "import flwr, torch; assert torch.__version__."
                                              "startswith('2.14.1')"], capture_output=True).returncode == 0
    if ok:
        return
    log(f"creating {FLWR_VENV} (flwr[simulation], torch==2.14.1, torchvision==0.29.1; ~2-3 min)")
    subprocess.run(["python3", "-m", "venv", str(FLWR_VENV)], check=True)
    subprocess.run([str(FLWR_PY), "-m", "pip", "install", "-q", "flwr[simulation]", "torch==2.14.1",
                    "torchvision==0.29.1"], check=True)


def fedsim_tree(name: str, w: dict, engine: dict | None = None) -> dict:
    """fedsim's config of a workload; ``engine``: engine settings over the benchmark's (e.g. pack)."""
    return {
        "name": f"bench-flower-{name}", "seed": HP["seed"], "algorithm": "fedavg", "out_dir": "/tmp/fedsim-bench-runs",
        "data": {"dataset": "cifar10", "num_clients": w["num_clients"], "partition": "iid",
                 "train_fraction": 1.0, "test_fraction": 1.0, "augment": HP["augment"]},
        "model": {"name": "cnn4", "personal_layers": 1},
        "train": {"rounds": w["rounds"], "local_epochs": HP["local_epochs"], "batch_size": HP["batch_size"],
                  "fraction": w["fraction"], "eval_every": w["rounds"] + 1,
                  "body": {k: HP[k] for k in ("lr", "momentum", "weight_decay")},
                  "head": {k: HP[k] for k in ("lr", "momentum", "weight_decay")}},
        "eval": {"finetune_epochs": 0},
        "engine": {"workers": 2, "cpus_per_worker": 1, "threads_per_worker": 1, "memory_format": HP["memory_format"],
                   **(engine or {})},
    }


def export(name: str, w: dict) -> Path:
    """The partition fedsim would use, as client -> indices into the decoded cache's .npy files."""
    from fedsim.data import load_dataset, make_partition
    from fedsim.data.cache import cache_dir, source_key
    from fedsim.data.datasets import _DATASETS, _find_source, resolve_root

    data = load_dataset("cifar10")
    part = make_partition("iid", data.train_y, data.test_y, w["num_clients"], HP["seed"])
    source, _ = _find_source(_DATASETS["cifar10"], resolve_root(None), False)
    folder = cache_dir() / f"cifar10-{source_key(source)}"
    assert (folder / "train_x.npy").exists(), folder
    sizes = sorted({len(t) for t in part.train})
    hp = {**HP, **w, "num_classes": data.num_classes, "input_shape": list(data.input_shape)}
    EXPORT.mkdir(parents=True, exist_ok=True)
    path = EXPORT / f"{name}.npz"
    arrays = {f"{s}_x_path": np.array(str(folder / f"{s}_x.npy")) for s in ("train", "test")}
    arrays |= {f"{s}_y_path": np.array(str(folder / f"{s}_y.npy")) for s in ("train", "test")}
    for split, parts in (("train", part.train), ("test", part.test)):
        arrays[f"{split}_idx"] = np.concatenate(parts)
        arrays[f"{split}_offsets"] = np.cumsum([0, *map(len, parts)])
    np.savez(path, mean=np.array(data.mean), std=np.array(data.std), hparams=np.array(json.dumps(hp)), **arrays)
    log(f"  exported {name}: {w['num_clients']} clients x {sizes} train samples -> {path}")
    return path


def run_flower(spec: Path) -> dict:
    """Flower in its venv; train_round_s skips round 1, which overlaps Flower's Ray start and actor spawn."""
    out = spec.with_suffix(".result.json")
    out.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{BENCH}", FLWR_TELEMETRY_ENABLED="0", RAY_USAGE_STATS_ENABLED="0")
    logf = spec.with_suffix(".flower.log")
    t0 = time.perf_counter()
    with open(logf, "w") as f:
        # Its own session: a Flower run whose simulation runtime crashed can hang; kill the whole group.
        proc = subprocess.Popen([str(FLWR_PY), str(BENCH / "_flower_app.py"), str(spec), str(out)], env=env,
                                stdout=f, stderr=subprocess.STDOUT, cwd=str(BENCH), start_new_session=True)
        try:
            rc = proc.wait(timeout=FLOWER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = "timeout"
    wall = time.perf_counter() - t0
    if rc != 0 or not out.exists():
        raise RuntimeError(f"Flower run failed (rc {rc}); see {logf}:\n" + logf.read_text()[-3000:])
    result = json.loads(out.read_text())
    result["process_s"] = wall
    result["all_train_round_s"] = result["train_round_s"]
    result["train_round_s"] = result["train_round_s"][1:] or result["train_round_s"]
    return result


def fedsim_side(name: str, w: dict, engine: dict | None = None) -> dict:
    r = run_fedsim(fedsim_tree(name, w, engine))
    # rounds.jsonl seconds: the server's sample -> dispatch -> collect -> average (+ evaluation in the last round)
    train_only = r["round_s"][:-1] if len(r["round_s"]) > 1 else r["round_s"]
    r["train_round_s"] = train_only[1:] if len(train_only) > 1 else train_only  # skip round 1 (warm-up) if we can
    r["startup_s"] = r["end_to_end_s"] - r["wall_seconds"]  # data, partition, ray.init (+ shutdown)
    r["eval_s"] = r["round_s"][-1] - median(r["train_round_s"]) if len(r["round_s"]) > 1 else float("nan")
    return r


def report(name: str, pairs: list) -> dict:
    """Medians over the chosen (fedsim, flower) pairs. eval s: Flower's is timed (configure_evaluate ->
    aggregate_evaluate); fedsim's is its last round minus a training round. rest s = end to end -
    rounds x s/round - eval: Ray start, actor spawn, data, files, shutdown (and, for Flower, its
    round 1 waits for the actors)."""
    w = WORKLOADS[name]
    print(f"{name}: {w['num_clients']} clients x {50000 // w['num_clients']}, {max(1, round(w['fraction'] * w['num_clients']))}"
          f" per round, {w['rounds']} rounds; {len(pairs)} pair(s)")
    print(f"  {'framework':<10}{'s/round':>9}{'eval s':>8}{'rest s':>8}{'end to end s':>14}{'others busy':>13}")
    row = {}
    for i, fw in enumerate(("fedsim", "flower")):
        rs = [p[i] for p in pairs]
        per_round = median([median(r["train_round_s"]) for r in rs])
        e2e = median([r["end_to_end_s"] for r in rs])
        ev = median([r["eval_s"] for r in rs])
        rest = e2e - w["rounds"] * per_round - ev
        row[fw] = {"round": per_round, "e2e": e2e, "eval": ev, "rest": rest}
        print(f"  {fw:<10}{per_round:>9.2f}{ev:>8.1f}{rest:>8.1f}{e2e:>14.1f}"
              f"{median([r['others_cores'] for r in rs]):>13.2f}")
    return {"round_ratio": row["flower"]["round"] / row["fedsim"]["round"],
            "e2e_ratio": row["flower"]["e2e"] / row["fedsim"]["e2e"], **row}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["device", "silo"], choices=list(WORKLOADS))
    ap.add_argument("--reps", type=int, default=2, help="interleaved repetitions of the cross-device pair")
    ap.add_argument("--silo-reps", type=int, default=1, help="repetitions of the cross-silo pair (~50 s per round)")
    ap.add_argument("--silo-rounds", type=int, default=WORKLOADS["silo"]["rounds"])
    ap.add_argument("--device-rounds", type=int, default=WORKLOADS["device"]["rounds"])
    ap.add_argument("--memory-format", default="auto", choices=["auto", "contiguous"],
                    help="fedsim's engine.memory_format; auto = channels_last on CPU, contiguous = NCHW like "
                         "the Flower client, to separate engine overhead from kernel layout")
    args = ap.parse_args()
    HP["memory_format"] = args.memory_format
    WORKLOADS["silo"]["rounds"], WORKLOADS["device"]["rounds"] = args.silo_rounds, args.device_rounds

    ensure_flower_venv()
    flwr_version = subprocess.run([str(FLWR_PY), "-c", "import flwr, ray; print(flwr.__version__, ray.__version__)"],
                                  capture_output=True, text=True).stdout.split()
    specs = {name: export(name, WORKLOADS[name]) for name in args.workloads}
    results: dict[str, dict[str, list]] = {n: {"fedsim": [], "flower": []} for n in args.workloads}
    for rep in range(max(args.reps, args.silo_reps)):
        for name in args.workloads:
            if rep >= (args.silo_reps if name == "silo" else args.reps):
                continue
            results[name]["fedsim"].append(measured(fedsim_side, name, WORKLOADS[name]))
            f = results[name]["fedsim"][-1]
            log(f"  rep {rep} {name}: fedsim {f['end_to_end_s']:.1f} s, train rounds "
                f"{[round(s, 2) for s in f['train_round_s']]}, others busy {f['others_cores']:.2f} cores")
            results[name]["flower"].append(measured(run_flower, specs[name]))
            f = results[name]["flower"][-1]
            log(f"  rep {rep} {name}: flower {f['end_to_end_s']:.1f} s, train rounds "
                f"{[round(s, 2) for s in f['train_round_s']]}, others busy {f['others_cores']:.2f} cores")

    print(f"\nfedsim (engine.memory_format={args.memory_format}) vs Flower {flwr_version[0]} (ray {flwr_version[1]}), "
          "FedAvg, cnn4, 2 workers x 1 thread")
    summary = {}
    for name in args.workloads:
        pairs = list(zip(results[name]["fedsim"], results[name]["flower"]))
        quiet = [p for p in pairs if max(p[0]["others_cores"], p[1]["others_cores"]) < QUIET_REP_CORES]
        for title, chosen in (("all reps", pairs), (f"quiet reps (others < {QUIET_REP_CORES} cores)", quiet)):
            if not chosen or (title != "all reps" and len(chosen) == len(pairs)):
                continue
            summary.setdefault(name, {})[title] = report(name, chosen)
    for name, by in summary.items():
        target = ">= 3" if name == "device" else "> 1"
        for title, s in by.items():
            print(f"RATIO Flower / fedsim, {name}, {title}: per round {s['round_ratio']:.2f}, "
                  f"end to end {s['e2e_ratio']:.2f}   target {target}")
    path = save("peer_flower", {"args": vars(args), "machine": machine(), "flwr": flwr_version,
                                "workloads": WORKLOADS, "results": results, "summary": summary})
    print(f"raw: {path}")


if __name__ == "__main__":
    main()
