"""model.name: minilm (issue 70, item 4): one client's LoRA update through fedsim against the same steps in a bare
PEFT loop, and a worker's memory with the encoder shared by its clients against one model copy per client.

Throughput (one process, one torch thread: fedsim's engine.threads_per_worker; A and B interleaved, in alternating
order, medians). Samples per CPU second of the process is samples/s per core, and holds on a shared, overloaded
machine where wall seconds swing with the other processes' load; wall-clock rates are reported beside it:
  A  fedsim: a worker's ClientRuntime (as the engine builds one) hosting one client of --samples token sequences of
     --length tokens; timed: ``train_client`` for one round (loading the broadcast, --epochs of SGD at --batch, the
     upload packed), FedSA-LoRA's split (A shared; B and the head personal).
  B  bare PEFT: BertModel.from_pretrained(the same folder) + peft.get_peft_model(LoRA r=8 on query/value), mean
     pooling and a linear head, SGD (momentum 0.9) over the same number of batches of the same shape.
  A / B is the target's ratio (>= 0.9).

Memory (a fresh process per case; /proc/self/status after every client trained one step: VmHWM, the peak resident
set, and RssAnon, the process's own heap, where the weights live once loaded):
  fedsim  one ClientRuntime hosting N clients, each trained once: one encoder, N sets of adapters and heads
  copies  N PEFT models, each loaded with from_pretrained and trained one step: what a loop holding a model per
          client costs

    .venv/bin/python benchmarks/lora_throughput.py --reps 7   # ~6 min on the 2-core VM (BENCHMARKS.md)
    .venv/bin/python benchmarks/lora_throughput.py --reps 9 --clients   # throughput alone
    .venv/bin/python benchmarks/lora_throughput.py --smoke    # a few steps, N = 1, 2: ~2.5 min
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from _common import BENCH, log, machine, median, parse, save

CLASSES = 4
MODULE = "lora_throughput"  # this file, imported by name as the data set plug-in (fedsim refuses __main__'s)


def token_sequences(root, options) -> "ArrayDataset":  # noqa: F821 (fedsim.data, imported inside)
    """``options.clients`` clients of ``options.samples`` sequences of ``options.length`` token ids each ([CLS], words
    of the class's own range, padding at the tail of every fourth), float32 as the data layer hands them over."""
    from fedsim.data import ArrayDataset
    from fedsim.data.array_dataset import content_digest

    clients, samples, length = options["clients"], options["samples"], options["length"]
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(clients), samples)
    labels = rng.integers(0, CLASSES, len(groups))
    ids = 2000 + 100 * labels[:, None] + rng.integers(0, 100, (len(groups), length))
    ids[:, 0] = 101
    ids[::4, length // 2:] = 0
    x = ids.astype(np.float32).reshape(-1, 1, length, 1)
    return ArrayDataset("tokens", x, labels, x[:clients], labels[:clients], tuple(map(str, range(CLASSES))),
                        (0.0,), (1.0,), groups, np.arange(clients), augmentable=False,
                        digest=content_digest(x, labels))


def config(clients: int, samples: int, length: int, batch: int, epochs: int):
    from fedsim.config import validate

    return validate({
        "name": "lora-bench", "seed": 0, "algorithm": "fedper", "out_dir": "/tmp/fedsim-bench-runs",
        "data": {"dataset": f"{MODULE}:token_sequences", "partition": "natural", "num_clients": clients,
                 "options": {"clients": clients, "samples": samples, "length": length}, "augment": False},
        "model": {"name": "minilm", "options": {"r": 8, "target_modules": ["query", "value"]},
                  "parts": {"body": ["*lora_A*"], "head": ["*lora_B*", "classifier.*"]}},
        "train": {"rounds": 1, "local_epochs": epochs, "batch_size": batch,
                  "body": {"lr": 0.01, "momentum": 0.9}, "head": {"lr": 0.01, "momentum": 0.9}},
        "eval": {"finetune_epochs": 0}, "engine": {"workers": 1, "threads_per_worker": 1}})


def fedsim_runtime(clients: int, samples: int, length: int, batch: int, epochs: int):
    """(a worker's runtime hosting every client, the round-1 broadcast)."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.plan.build import build_plan, load_inputs

    cfg = config(clients, samples, length, batch, epochs)
    plan = build_plan(cfg, load_inputs(cfg))
    runtime = ClientRuntime(plan.for_workers(), dict(enumerate(plan.clients)))
    return runtime, plan.initial_server_state()


class BarePeft:
    """The same model in the plainest PEFT form, trained on int64 ids."""

    def __init__(self):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import BertModel

        from fedsim.core.pretrained import force_offline, minilm_folder

        force_offline()
        self.torch = torch
        encoder = BertModel.from_pretrained(minilm_folder(), add_pooling_layer=False, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)
        self.encoder = get_peft_model(encoder, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"]))
        self.head = torch.nn.Linear(384, CLASSES)
        trainable = [p for p in self.encoder.parameters() if p.requires_grad] + list(self.head.parameters())
        self.optimizer = torch.optim.SGD(trainable, lr=0.01, momentum=0.9)

    def step(self, ids, labels) -> None:
        torch = self.torch
        mask = (ids != 0).long()
        hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        loss = torch.nn.functional.cross_entropy(self.head(pooled), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def throughput(args) -> dict:
    import torch

    runtime, broadcast = fedsim_runtime(1, args.samples, args.length, args.batch, args.epochs)
    torch.set_num_threads(1)  # the runtime set it already (threads_per_worker: 1); the bare loop runs under it too
    data = token_sequences(None, {"clients": 1, "samples": args.samples, "length": args.length})
    ids = torch.from_numpy(data.train_x.reshape(args.samples, args.length)).long()
    labels = torch.from_numpy(data.train_y)
    bare = BarePeft()
    batches = [(ids[i:i + args.batch], labels[i:i + args.batch]) for i in range(0, args.samples, args.batch)]
    samples = args.samples * args.epochs
    wall: dict[str, list[float]] = {"fedsim": [], "bare": []}
    cpu: dict[str, list[float]] = {"fedsim": [], "bare": []}

    def fedsim_update(rep: int) -> None:
        assert np.isfinite(float(runtime.train_client(broadcast, 0, rep + 1).loss))

    def bare_update(rep: int) -> None:
        for _ in range(args.epochs):
            for x, y in batches:
                bare.step(x, y)

    for rep in range(args.reps):
        order = [("fedsim", fedsim_update), ("bare", bare_update)]
        for side, update in order if rep % 2 == 0 else order[::-1]:  # alternated: neither side always runs second
            w0, c0 = time.perf_counter(), time.process_time()
            update(rep)
            wall[side].append(time.perf_counter() - w0)
            cpu[side].append(time.process_time() - c0)
        log(f"rep {rep}: samples per CPU second fedsim {samples / cpu['fedsim'][-1]:.1f}, bare PEFT "
            f"{samples / cpu['bare'][-1]:.1f}; per wall second {samples / wall['fedsim'][-1]:.1f}, "
            f"{samples / wall['bare'][-1]:.1f}")
    rates = {f"{side}_samples_per_{clock}": samples / median(times[side])
             for clock, times in (("cpu_s", cpu), ("wall_s", wall)) for side in ("fedsim", "bare")}
    return {"samples_per_update": samples, "wall_s": wall, "cpu_s": cpu, **rates,
            "ratio_cpu": rates["fedsim_samples_per_cpu_s"] / rates["bare_samples_per_cpu_s"],
            "ratio_wall": rates["fedsim_samples_per_wall_s"] / rates["bare_samples_per_wall_s"]}


def memory_mib() -> dict[str, float]:
    """/proc/self/status: the peak resident set, the resident set now, and its anonymous (heap) and file parts."""
    with open("/proc/self/status") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}


def memory_child(mode: str, clients: int, length: int) -> dict:
    """The peak resident set of one case (run in a fresh process)."""
    import torch

    torch.set_num_threads(1)
    if mode == "fedsim":
        runtime, broadcast = fedsim_runtime(clients, 4, length, 4, 1)
        for client in range(clients):
            runtime.keep(client, runtime.train_client(broadcast, client, 1))
    else:
        ids = torch.full((4, length), 2000, dtype=torch.long)
        models = []
        for _ in range(clients):
            models.append(BarePeft())
            models[-1].step(ids, torch.zeros(4, dtype=torch.long))
    return {"mode": mode, "clients": clients, **memory_mib()}


def memory(args) -> list[dict]:
    rows = []
    for clients in args.clients:
        for mode in ("fedsim", "copies"):
            out = subprocess.run([sys.executable, str(BENCH / f"{MODULE}.py"), "--memory-child", mode, str(clients),
                                  "--length", str(args.length)], capture_output=True, text=True, check=True, cwd=BENCH)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            log(f"memory {mode} N={clients}: peak {rows[-1]['VmHWM']:.0f} MiB, anonymous {rows[-1]['RssAnon']:.0f} MiB")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 4, 8],
                        help="memory: clients per worker (none: throughput alone)")
    parser.add_argument("--memory-child", nargs=2, metavar=("MODE", "CLIENTS"), help=argparse.SUPPRESS)
    args = parse(parser, samples=16, batch=8, reps=1, clients=[1, 2])  # --smoke: a few steps, N = 1, 2
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child[0], int(args.memory_child[1]), args.length)))
        return
    info = machine()
    result = {"machine": info, "settings": {k: v for k, v in vars(args).items() if k != "memory_child"},
              "throughput": throughput(args), "memory": memory(args)}
    t = result["throughput"]
    log(f"fedsim / bare PEFT, samples per CPU second (one thread: per core): {t['fedsim_samples_per_cpu_s']:.2f} / "
        f"{t['bare_samples_per_cpu_s']:.2f} = {t['ratio_cpu']:.3f} (target >= 0.9); per wall second "
        f"{t['ratio_wall']:.3f}; load average at start {info['load_avg']}")
    log(f"saved {save('lora_throughput', result)}")


if __name__ == "__main__":
    main()
