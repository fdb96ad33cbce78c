"""The Flower side of peer_flower.py. Runs inside benchmarks/.venv-flwr (flwr + its own ray), never
inside fedsim's venv: peer_flower.py starts it as a subprocess.

Flower 1.42's Python simulation API: ``flwr.simulation.run_simulation`` with a message-based
``ServerApp`` (``flwr.serverapp.strategy.FedAvg``) and a ``ClientApp`` with ``@train`` / ``@evaluate``
handlers, on the Ray backend with 1 CPU per virtual-client actor (2 actors on 2 cores, like fedsim's
2 workers x 1 thread). The model and augmentation are fedsim's own code (PYTHONPATH=repo root:
``fedsim.models`` and ``fedsim.data.transforms`` need only torch/numpy/PIL), and the clients read the
same memory-mapped uint8 cache files through the partition peer_flower.py exported.

Client sampling and aggregation are Flower's own (its FedAvg): that is what is being measured. Each
client seeds its shuffles from (seed, round, partition id) with a formula of its own, not fedsim's
``client_generator``: that lives in ``fedsim.client.runtime``, which imports Lightning, and this venv
has none (checked: ``import fedsim.client.runtime`` fails here). Matching streams would not make the
work identical anyway, since Flower samples different clients than fedsim each round; only the
amount of work (clients, images, epochs, batch size) is matched.

Choices that favour Flower: each actor process keeps the data arrays and one model instance
across messages (only the weights are loaded per message), and federated evaluation runs only
in the last round, as fedsim's does (eval_every > rounds).

Usage (by peer_flower.py): python -c "import _flower_app; _flower_app.main()" SPEC.npz OUT.json
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

SPEC_ENV = "FEDSIM_BENCH_SPEC"
_CACHE: dict = {}
TIMES: dict[str, float] = {}


def _spec() -> dict:
    if "spec" not in _CACHE:
        torch.set_num_threads(1)  # one thread per actor, as fedsim's workers
        with np.load(os.environ[SPEC_ENV], allow_pickle=False) as z:
            spec = {k: z[k] for k in z.files}
        spec["train_x"] = np.load(str(spec["train_x_path"]), mmap_mode="r")
        spec["train_y"] = np.load(str(spec["train_y_path"]), mmap_mode="r")
        spec["test_x"] = np.load(str(spec["test_x_path"]), mmap_mode="r")
        spec["test_y"] = np.load(str(spec["test_y_path"]), mmap_mode="r")
        spec["hp"] = json.loads(str(spec["hparams"]))
        _CACHE["spec"] = spec
    return _CACHE["spec"]


def _initial_net() -> torch.nn.Module:
    from fedsim.models import build_model

    hp = _spec()["hp"]
    torch.manual_seed(hp["seed"])
    return build_model("cnn4", hp["num_classes"], tuple(hp["input_shape"]))


def _net() -> torch.nn.Module:
    """One model per client actor, reused across messages (only the weights are loaded per message)."""
    if "net" not in _CACHE:
        _CACHE["net"] = _initial_net()
    return _CACHE["net"]


def _client_tensors(pid: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    from fedsim.data.transforms import to_float

    s = _spec()
    off, idx = s[f"{split}_offsets"], s[f"{split}_idx"]
    rows = idx[off[pid]:off[pid + 1]]
    x = to_float(s[f"{split}_x"][rows], tuple(s["mean"]), tuple(s["std"]))
    return x, torch.as_tensor(np.asarray(s[f"{split}_y"][rows]))


def _build_apps():
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    from fedsim.data.transforms import random_crop_flip

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        hp = _spec()["hp"]
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content["config"]["server-round"])
        x, y = _client_tensors(pid, "train")
        net = _net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        net.train()
        opt = torch.optim.SGD(net.parameters(), lr=hp["lr"], momentum=hp["momentum"],
                              weight_decay=hp["weight_decay"])
        gen = torch.Generator().manual_seed(hp["seed"] * 1_000_003 + server_round * 10_007 + pid)
        losses = []
        for _ in range(hp["local_epochs"]):
            order = torch.randperm(len(y), generator=gen)
            for start in range(0, len(y), hp["batch_size"]):
                idx = order[start:start + hp["batch_size"]]
                xb = random_crop_flip(x[idx], gen) if hp["augment"] else x[idx]
                loss = F.cross_entropy(net(xb), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.detach())
        metrics = MetricRecord({"train_loss": float(torch.stack(losses).mean()), "num-examples": len(y)})
        return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)

    @client_app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        x, y = _client_tensors(pid, "test")
        net = _net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        net.eval()
        with torch.no_grad():
            correct = sum(int((net(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum()) for i in range(0, len(y), 500))
        metrics = MetricRecord({"eval_acc": correct / len(y), "num-examples": len(y)})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    class TimedFedAvg(FedAvg):
        """FedAvg that stamps each round's training phase and evaluates only in the last round."""

        def __init__(self, rounds: int, **kw):
            super().__init__(**kw)
            self.rounds = rounds

        def configure_train(self, server_round, arrays, config, grid):
            TIMES[f"train_start_{server_round}"] = time.perf_counter()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):
            out = super().aggregate_train(server_round, replies)
            TIMES[f"train_end_{server_round}"] = time.perf_counter()
            return out

        def configure_evaluate(self, server_round, arrays, config, grid):
            if server_round < self.rounds:
                return []
            TIMES["eval_start"] = time.perf_counter()
            return super().configure_evaluate(server_round, arrays, config, grid)

        def aggregate_evaluate(self, server_round, replies):
            out = super().aggregate_evaluate(server_round, replies)
            if server_round == self.rounds:
                TIMES["eval_end"] = time.perf_counter()
                if out is not None:
                    TIMES["eval_acc"] = float(out["eval_acc"])
            return out

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        hp = _spec()["hp"]
        n = hp["num_clients"]
        sampled = max(1, round(hp["fraction"] * n))
        strategy = TimedFedAvg(hp["rounds"], fraction_train=hp["fraction"], fraction_evaluate=1.0,
                               min_train_nodes=sampled, min_evaluate_nodes=n, min_available_nodes=n)
        TIMES["server_main"] = time.perf_counter()
        strategy.start(grid=grid, initial_arrays=ArrayRecord(_initial_net().state_dict()), num_rounds=hp["rounds"])
        TIMES["server_done"] = time.perf_counter()

    return server_app, client_app


def main() -> None:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    os.environ[SPEC_ENV] = spec_path
    t_import = time.perf_counter()
    from flwr.simulation import run_simulation

    hp = _spec()["hp"]
    server_app, client_app = _build_apps()
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               # address="local": always a fresh local Ray. Without it ray.init() joins the newest cluster
               # a `ray start` left on this machine (another user's) and fails on num_cpus.
               "init_args": {"address": "local", "num_cpus": hp["cpus"], "include_dashboard": False,
                             "logging_level": "warning"}}
    t0 = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=hp["num_clients"],
                   backend_config=backend)
    t1 = time.perf_counter()
    out = {"end_to_end_s": t1 - t0, "import_s": t0 - t_import, "start": t0,
           "times": {k: v for k, v in TIMES.items()}}
    R = hp["rounds"]
    out["train_round_s"] = [TIMES[f"train_end_{r}"] - TIMES[f"train_start_{r}"] for r in range(1, R + 1)
                            if f"train_end_{r}" in TIMES]
    out["eval_s"] = TIMES.get("eval_end", float("nan")) - TIMES.get("eval_start", float("nan"))
    out["startup_s"] = TIMES.get("train_start_1", float("nan")) - t0
    out["pid"] = os.getpid()
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    import _flower_app  # run as the importable module, so Ray pickles its functions by reference

    _flower_app.main()
