"""Per-client fixed cost against one SGD step, on a GPU: `profiling.py fixedcost`'s measurement with the
worker's runtime on CUDA, as a Ray worker holding a GPU would place it.

    python benchmarks/gpu_fixedcost.py [--train-images N] [--models cnn4 mobilenet_v1 resnet34] > rows.jsonl

CUDA runs asynchronously, so here every timer reading first waits for the device (torch.cuda.synchronize):
"fixed" is then the time a client spends outside training_step with the device idle at each boundary, an
upper bound on what a client adds to its SGD steps. ``--cpu`` runs the same path on the CPU (to test it).
FEDSIM_DATA may hold a CIFAR-10 subset (benchmarks/gpu_subset.py); give its training-image count."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import profiling  # noqa: E402  (benchmarks/ is not a package)

from fedsim.client.runtime import ClientRuntime  # noqa: E402


def on_cuda() -> None:
    """Place runtimes on the GPU and make every timer reading wait for the device."""
    ClientRuntime._assigned_gpu = staticmethod(lambda: True)
    clock = time.perf_counter

    def synced() -> float:
        torch.cuda.synchronize()
        return clock()

    time.perf_counter = synced


@contextlib.contextmanager
def op_profile(path: str | None, model: str, cuda: bool):
    """torch.profiler around one model's measurement: where the time outside the SGD steps goes, op by op."""
    if path is None:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        yield
    table = prof.key_averages()
    with open(path, "a") as out:
        for key in ("self_cpu_time_total", "self_cuda_time_total" if cuda else "cpu_time_total"):
            out.write(f"== {model}: top ops by {key}\n{table.table(sort_by=key, row_limit=35, max_name_column_width=60)}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-images", type=int, default=profiling.CIFAR_TRAIN,
                        help="training images of FEDSIM_DATA's CIFAR-10 (default: the full set)")
    parser.add_argument("--models", nargs="+", default=list(profiling.FIXED_CLIENTS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU (tests this script)")
    parser.add_argument("--profile", metavar="FILE", help="also write torch.profiler's op tables (self CPU and "
                        "device time) of each model's whole measurement to FILE")
    args = parser.parse_args()
    if not args.cpu:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_fixedcost: no CUDA device (use --cpu to test the script)")
        on_cuda()
    profiling.CIFAR_TRAIN = args.train_images  # fixed_cost_child takes its clients' images as a fraction of it
    for model in args.models:
        with op_profile(args.profile, model, not args.cpu):
            row = profiling.fixed_cost_child(model, "fedavg", profiling.FIXED_CLIENTS[model], args.reps)
        row["device"] = "cpu" if args.cpu else torch.cuda.get_device_name()
        print(json.dumps(row), flush=True)
        print(f"{model:<13} step {1000 * row['step_s']:8.2f} ms  fixed {1000 * row['fixed_s']:7.2f} ms  "
              f"RATIO fixed/step {row['fixed_s'] / row['step_s']:.3f}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
