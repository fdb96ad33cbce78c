"""fedsim end to end vs the simplest single-process PyTorch loop doing the same SGD steps.

Workload: experiments/quickstart.yaml, FedPer variant (10 clients, CIFAR-10 k=4 classes, 10% train /
20% test, 4-conv CNN, e=4, b=50, SGD 0.01/0.9/5e-4 for body and head, crop+flip augmentation,
every client evaluated every round), for --rounds rounds (default: the quickstart's 10).

  A  fedsim: fedsim.simulate.run(cfg) + ray.shutdown(), timed from the call (data, partition,
     ray.init, server and 2 worker actors x 1 thread, rounds, run folder) to the return.
     engine.memory_format=auto, i.e. channels_last on this CPU.
  AL the same on the local backend (engine.backend=local): one worker x 2 threads in this process, no Ray.
  B  bare loop, torch.set_num_threads(2), NCHW: the simplest loop. Same partition
     (fedsim.data.make_partition), same model (fedsim.models.build_model, same seed), same client
     sample (fedsim.plan.sample_clients), same per-client shuffles and augmentation draws
     (fedsim.client.randomness.client_generator), same number of batches, personal heads in a dict,
     base averaged by fedsim's exact fixed-point sum (fedsim.core.aggregate), every client scored every round.
     Timed from loading the data to the last evaluation. A / B is the target's ratio.
  C  the same bare loop in channels_last, 2 threads: the same kernels fedsim runs, so A / C is
     fedsim's own overhead (Ray, actors, Lightning, weight packing, logging, checkpoints).
  D  the bare loop in channels_last with 1 thread, fedsim's thread count: it reproduces fedsim's
     per-client accuracies (printed as a check that both sides do the same work).

Repetitions are interleaved A, B, C, (D), A, B, C, ... in one process; medians are reported.

    .venv/bin/python benchmarks/overhead.py              # 10 rounds, 2 reps: ~15 min
    .venv/bin/python benchmarks/overhead.py --rounds 3 --reps 1
    .venv/bin/python benchmarks/overhead.py --smoke       # 1 round on 2% of the data: checks the script runs
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from _common import (QUIET_REP_CORES, REPO, check_quickstart, log, machine, measured, median, parse, quickstart,
                     run_fedsim, save)


def bare_run(tree: dict, threads: int, channels_last: bool) -> dict:
    """The plain loop. Returns wall seconds, per-round seconds and the final per-client accuracy."""
    from fedsim.client.randomness import client_generator
    from fedsim.core.aggregate import FixedPoint, ReferenceExactSum
    from fedsim.data import load_dataset, make_partition, random_crop_flip, to_float
    from fedsim.models import build_model
    from fedsim.plan import sample_clients

    torch.set_num_threads(threads)
    d, t, seed = tree["data"], tree["train"], tree["seed"]
    t0 = time.perf_counter()
    data = load_dataset(d["dataset"])
    part = make_partition(d["partition"], data.train_y, data.test_y, d["num_clients"], seed, k=d["k"],
                          train_fraction=d["train_fraction"], test_fraction=d["test_fraction"])
    torch.manual_seed(seed)
    net = build_model(tree["model"]["name"], data.num_classes, data.input_shape)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net.to(memory_format=fmt)
    base_keys, head_keys = net.split_keys(tree["model"]["personal_layers"])
    head_set = set(head_keys)
    named = dict(net.named_parameters())
    opts = [torch.optim.SGD([p for k, p in named.items() if (k in head_set) == is_head],
                            lr=t[part_]["lr"], momentum=t[part_]["momentum"], weight_decay=t[part_]["weight_decay"])
            for part_, is_head in (("body", False), ("head", True))]

    def tensors(idx: np.ndarray, x: np.ndarray, y: np.ndarray):
        return to_float(x[idx], data.mean, data.std).contiguous(memory_format=fmt), torch.as_tensor(y[idx])

    train = [tensors(i, data.train_x, data.train_y) for i in part.train]
    test = [tensors(i, data.test_x, data.test_y) for i in part.test]
    state = net.state_dict()
    global_base = {k: state[k].clone() for k in base_keys}
    initial_head = {k: state[k].clone() for k in head_keys}
    heads: dict[int, dict[str, torch.Tensor]] = {}
    n_clients, batch = len(train), t["batch_size"]
    round_s, accs = [], {}
    for r in range(1, t["rounds"] + 1):
        tr = time.perf_counter()
        uploads = []
        for c in sample_clients(seed, r, n_clients, t["fraction"]):
            x, y = train[c]
            net.load_state_dict({**global_base, **heads.get(c, initial_head)})
            for opt in opts:
                opt.state.clear()
            net.train()
            gen = client_generator(seed, r, c)
            for _ in range(t["local_epochs"]):
                order = torch.randperm(len(y), generator=gen)
                for start in range(0, len(y), batch):
                    idx = order[start:start + batch]
                    xb = random_crop_flip(x[idx], gen) if d["augment"] else x[idx]
                    loss = F.cross_entropy(net(xb), y[idx])
                    for opt in opts:
                        opt.zero_grad(set_to_none=True)
                    loss.backward()
                    for opt in opts:
                        opt.step()
            state = net.state_dict()
            heads[c] = {k: state[k].clone() for k in head_keys}
            uploads.append((c, len(y), {k: state[k].to(torch.float32).numpy().copy() for k in base_keys}))
        # fedsim's own average, gamma_j = n_j / sum n, summed exactly in fixed point as its workers sum
        # (fedsim.core.aggregate), over the base as one flat vector scaled per tensor from the current global
        reference = np.concatenate([global_base[k].to(torch.float32).numpy().ravel() for k in base_keys])
        offsets = tuple(np.cumsum([0, *(global_base[k].numel() for k in base_keys)]).tolist())
        total_weight = sum(n for _, n, _ in uploads)
        plan = FixedPoint.plan(reference, offsets, total_weight)
        summed = ReferenceExactSum(plan)
        for _, n, u in uploads:
            summed.add(n, np.concatenate([u[k].ravel() for k in base_keys]))
        mean = np.concatenate([plan.mean(summed.total, total_weight, tensor)
                               for tensor in range(len(base_keys))]).astype(np.float32)
        global_base = {k: torch.from_numpy(mean[a:b].reshape(global_base[k].shape)).to(global_base[k].dtype)
                       for k, a, b in zip(base_keys, offsets, offsets[1:])}
        if r % t["eval_every"] == 0 or r == t["rounds"]:
            net.eval()
            with torch.no_grad():
                for c in range(n_clients):
                    net.load_state_dict({**global_base, **heads.get(c, initial_head)})
                    x, y = test[c]
                    correct = sum(int((net(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum())
                                  for i in range(0, len(y), 500))
                    accs[c] = correct / len(y)
        round_s.append(time.perf_counter() - tr)
    return {"end_to_end_s": time.perf_counter() - t0, "round_s": round_s, "acc": accs}


LABELS = {"fedsim": "fedsim (2 workers x 1 thread)", "fedsim_local": "fedsim local (1 worker x 2 threads)",
          "bare": "bare loop, 2 threads, NCHW",
          "bare_cl": "bare loop, 2 threads, channels_last", "bare1_cl": "bare loop, 1 thread, channels_last"}


def report(runs: dict[str, list], title: str) -> None:
    """Medians over reps (per-round: median within a rep, then over reps)."""
    def e2e(name):
        return median([r["end_to_end_s"] for r in runs[name]])

    def per_round(name):
        return median([median(r["round_s"]) for r in runs[name]])

    print(f"-- {title}")
    print(f"{'':38}{'reps':>5}{'end to end s':>14}{'per round s':>13}{'others busy (cores)':>21}")
    for name, xs in runs.items():
        if xs:
            print(f"{LABELS[name]:38}{len(xs):>5}{e2e(name):>14.1f}{per_round(name):>13.2f}"
                  f"{median([r['others_cores'] for r in xs]):>21.2f}")
    for engine in (name for name in ("fedsim", "fedsim_local") if runs[name]):
        startup = median([r["end_to_end_s"] - sum(r["round_s"]) for r in runs[engine]])
        print(f"{LABELS[engine]} start-up + teardown (end to end - sum of rounds): {startup:.1f} s")
        for name, what in (("bare", "target <= 1.10"), ("bare_cl", "fedsim's own overhead, same kernels"),
                           ("bare1_cl", "same work, 1 thread")):
            if runs[name]:
                print(f"RATIO {LABELS[engine]} / {LABELS[name]}: end to end {e2e(engine) / e2e(name):.3f}, "
                      f"per round {per_round(engine) / per_round(name):.3f}   ({what})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="default: the quickstart's rounds")
    ap.add_argument("--reps", type=int, default=2, help="interleaved repetitions of A, B and C")
    ap.add_argument("--bare1-reps", type=int, default=1, help="repetitions of D, the 1-thread same-work loop")
    ap.add_argument("--local-reps", type=int, default=None, help="repetitions of A on the local backend (default: "
                    "--reps)")
    ap.add_argument("--only-same-work", metavar="JSON", help="run D once and compare its per-client accuracies with "
                    "fedsim's in an earlier run's raw file (benchmarks/results/overhead-*.json)")
    args = parse(ap, rounds=1, reps=1, bare1_reps=1, local_reps=1)

    check_quickstart()
    if args.only_same_work:
        return same_work(args)
    rounds = args.rounds or yaml.safe_load((REPO / "experiments" / "quickstart.yaml").read_text())["train"]["rounds"]
    tree = quickstart({"train.rounds": rounds})
    rounds = tree["train"]["rounds"]
    log(f"overhead: quickstart FedPer, {rounds} rounds, {args.reps} interleaved reps")
    local = quickstart({"train.rounds": rounds, "engine.backend": "local", "engine.workers": 1,
                        "engine.threads_per_worker": 2})
    local_reps = args.reps if args.local_reps is None else args.local_reps
    plan = {"fedsim": (run_fedsim, (tree,), args.reps), "fedsim_local": (run_fedsim, (local,), local_reps), "bare": (bare_run, (tree, 2, False), args.reps),
            "bare_cl": (bare_run, (tree, 2, True), args.reps), "bare1_cl": (bare_run, (tree, 1, True), args.bare1_reps)}
    runs: dict[str, list] = {name: [] for name in plan}
    for rep in range(max(args.reps, args.bare1_reps, local_reps)):
        for name, (fn, fn_args, reps) in plan.items():
            if rep < reps:
                runs[name].append(measured(fn, *fn_args))
                r = runs[name][-1]
                log(f"  rep {rep}: {LABELS[name]} {r['end_to_end_s']:.1f} s (rounds {[round(x, 1) for x in r['round_s']]}), "
                    f"other processes busy {r['others_cores']:.2f} cores")

    print(f"\nquickstart FedPer, {rounds} rounds, {len(runs['fedsim'])} interleaved reps")
    report(runs, "all reps")
    quiet = {name: [r for r in xs if r["others_cores"] < QUIET_REP_CORES] for name, xs in runs.items()}
    if all(quiet.values()) and any(len(quiet[n]) < len(runs[n]) for n in runs):
        report(quiet, f"quiet reps only (other processes < {QUIET_REP_CORES} cores)")

    # Same work? fedsim's final per-client accuracy vs the bare loops' (1 thread = fedsim's thread count).
    fed_acc = {int(k): v for k, v in runs["fedsim"][0]["summary"]["per_client_acc"].items()}
    for name in ("bare1_cl", "bare_cl", "bare"):
        if runs[name]:
            diff = max(abs(fed_acc[c] - runs[name][0]["acc"][c]) for c in fed_acc)
            print(f"same work check: max |acc fedsim - acc {LABELS[name]}| over clients: {diff:.4f}")
    path = save("overhead", {"args": vars(args), "machine": machine(), **runs})
    print(f"raw: {path}")


def same_work(args) -> None:
    """D alone against an earlier run's fedsim accuracies (the same config and seed give the same ones)."""
    import json

    earlier = json.loads(Path(args.only_same_work).read_text())
    tree = quickstart({"train.rounds": earlier["args"]["rounds"] or 10})
    fed_acc = {int(k): v for k, v in earlier["fedsim"][0]["summary"]["per_client_acc"].items()}
    bare = bare_run(tree, 1, True)
    diff = max(abs(fed_acc[c] - bare["acc"][c]) for c in fed_acc)
    print(f"same work check ({len(fed_acc)} clients, {tree['train']['rounds']} rounds): max |acc fedsim - acc "
          f"{LABELS['bare1_cl']}| = {diff:.4f}")


if __name__ == "__main__":
    main()
