"""What secure aggregation (privacy.secure_aggregation, fedsim/privacy/secagg.py) costs a round, as a ratio.

A round's training and aggregation on one worker's runtime, as the engine runs it (``ClientRuntime.train_and_sum``
over the whole cohort of K clients, the partial added to the server's ``RoundSums``): A without secure
aggregation, B with each client's fixed-point upload masked against the K - 1 others before it enters the sum,
interleaved A, B, A, B, ... in this process for --reps repetitions; the median of each and B / A, in CPU seconds of
this process (one torch thread: its work, whatever else the shared machine runs meanwhile). Evaluation is
left out (it does not change), so B / A is the ratio of a round's training step; a whole round's is lower. B's
unmasked sum is checked bit for bit against A's. Apart: the server's recovery when 10% of the cohort drops out
(``PairwiseMasks.unmask``: one seed expanded per (dropped, survivor) pair).

Cases: FedAvg, e = 1, 20 train images per client, K = 10, 50, 100, on cnn4 (CIFAR-10) and on the MLP of the
synthetic dataset (a small model).

    .venv/bin/python benchmarks/secagg.py [--cohorts 10 50 100] [--models cnn4 mlp] [--reps 3]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from _common import fixed_point_scales, machine, median, parse, save, worker_runtime

from fedsim.config import validate
from fedsim.core.aggregate import RoundSums
from fedsim.core.protocol import WEIGHTS
from fedsim.privacy.secagg import PairwiseMasks

SEED = 0


def config(model: str, cohort: int):
    """FedAvg over ``cohort`` clients, every one trained each round (train.fraction 1)."""
    data = ({"dataset": "cifar10", "num_clients": cohort, "partition": "classes", "k": 2,
             "train_fraction": 20 * cohort / 50_000, "test_fraction": 10 * cohort / 10_000} if model == "cnn4" else
            {"dataset": "synthetic", "partition": "natural", "num_clients": cohort, "options": {"num_clients": cohort}})
    return validate({"name": "bench-secagg", "seed": SEED, "algorithm": "fedavg", "out_dir": "/tmp/fedsim-bench-runs",
                     "data": data, "model": {"name": model, "personal_layers": 1},
                     "train": {"rounds": 1, "local_epochs": 1, "batch_size": 20, "fraction": 1.0},
                     "eval": {"finetune_epochs": 0},
                     "engine": {"workers": 1, "cpus_per_worker": 1, "threads_per_worker": 1}})


def one_round(rt, broadcast, cohort: list[int], scaling, masks: PairwiseMasks | None) -> tuple[float, np.ndarray]:
    """CPU seconds of one round's training step (train, mask, sum, add at the server; nobody dropped) and its sum."""
    started = time.process_time()
    partial = rt.train_and_sum(broadcast, cohort, 1, scaling, masks)
    sums = RoundSums(scaling.scales, rt.plan.model.initial["shared"].size)
    sums.add(partial.sums, partial.weights)
    if masks is not None:
        masks.unmask(sums.totals, cohort)
    return time.process_time() - started, sums.totals[WEIGHTS]


def case(model: str, k: int, reps: int) -> dict:
    rt = worker_runtime(config(model, k))
    cohort = list(range(k))
    broadcast = {WEIGHTS: rt.plan.model.initial["shared"]}
    scaling = fixed_point_scales(rt, sum(len(c.train) for c in rt.client_data.values()))
    masks = PairwiseMasks(SEED, 1, tuple(cohort))
    one_round(rt, broadcast, cohort, scaling, None)  # warm-up: data, kernels
    times: dict[bool, list[float]] = {False: [], True: []}
    totals = {}
    for _ in range(reps):
        for secure in (False, True):
            seconds, totals[secure] = one_round(rt, broadcast, cohort, scaling, masks if secure else None)
            times[secure].append(seconds)
    dropped = cohort[::10]  # 10% of the cohort did not deliver
    survivors = [c for c in cohort if c not in dropped]
    residue = {WEIGHTS: np.zeros(broadcast[WEIGHTS].size, np.int64)}
    started = time.process_time()
    masks.unmask(residue, survivors)
    recovery = time.process_time() - started
    a, b = median(times[False]), median(times[True])
    return {"model": model, "cohort": k, "values": int(broadcast[WEIGHTS].size), "plain_s": times[False],
            "secure_s": times[True], "ratio": b / a, "mask_s_per_client": (b - a) / k,
            "recovery_10pct_s": recovery, "recovery_vs_plain": recovery / a,
            "identical": bool(np.array_equal(totals[False], totals[True]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohorts", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--models", nargs="+", default=["cnn4", "mlp"])
    parser.add_argument("--reps", type=int, default=3)
    args = parse(parser, cohorts=[3], models=["mlp"], reps=1)
    rows = []
    print("model  values     K   plain s   secure s   B / A   mask s/client  recovery(10% dropped)/A  sum identical")
    for model in args.models:
        for k in args.cohorts:
            r = case(model, k, args.reps)
            rows.append(r)
            print(f"{model:5} {r['values']:8,} {k:4} {median(r['plain_s']):9.3f} {median(r['secure_s']):9.3f} "
                  f"{r['ratio']:7.2f} {r['mask_s_per_client']:13.4f} {r['recovery_vs_plain']:16.3f}"
                  f"          {'yes' if r['identical'] else 'NO'}", flush=True)
    print("saved", save("secagg", {"machine": machine(), "reps": args.reps, "cases": rows}))


if __name__ == "__main__":
    main()
