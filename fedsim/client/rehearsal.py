"""One training step on one batch of one client, and its scoring on one test batch, in the driver and without Ray:
what a module or a callback does wrong (no loss, a Trainer-only callback under the Fabric loop, a logged name
fedsim's records use, ...) is refused before a run starts, and by ``--dry-run``, instead of by a worker after Ray
and the workers have started. ``--dry-run`` also times a few steps so (:func:`throughput`) for its time estimate."""
from __future__ import annotations

import dataclasses
import tempfile
import time

import torch

from fedsim.algorithms import PARTS
from fedsim.client.runtime import ClientRuntime
from fedsim.core.protocol import ClientData
from fedsim.errors import ConfigError, UserCodeError
from fedsim.plan import RunPlan, WorkerPlan


def rehearse(plan: RunPlan) -> None:
    """A worker's set-up over the first client that has training data, one step of every part on its first batch,
    what the module logged gathered, and one test batch scored; nothing of it is kept. Raises what a worker would."""
    client = next((c for c, data in enumerate(plan.clients) if len(data.train)), None)
    if client is None:
        return
    threads = torch.get_num_threads()  # a worker's set-up fixes the process's threads (engine.threads_per_worker)
    try:
        # In a scratch out_dir: what the step writes (a ModelCheckpoint's file under RUN/lightning/) never lands in
        # the run folder, which --dry-run promises to leave unwritten and a run has not created yet.
        with tempfile.TemporaryDirectory(prefix="fedsim-rehearsal-") as scratch:
            _one_step(_on_this_machine(plan, scratch), client, plan.clients[client])
    except (ConfigError, UserCodeError):
        raise
    except Exception as err:  # as a worker reports it: the user's, once (fedsim.client.worker.Worker)
        message = str(err).strip().splitlines()[0] if str(err).strip() else "no message"
        raise UserCodeError(f"model.client: one training step on one batch raised {type(err).__name__}: {message}; "
                            "fix the module or its callbacks") from None
    finally:
        torch.set_num_threads(threads)


def throughput(plan: RunPlan, batches: int = 4) -> float | None:
    """The sample-steps per second one worker trains at on this machine, at its threads (engine.threads_per_worker):
    the first client with training data set up as a worker sets it up, one batch to warm up, then up to ``batches``
    of its batches timed; None where no client has training data. The rehearsal's set-up, so its errors too."""
    client = next((c for c, data in enumerate(plan.clients) if len(data.train)), None)
    if client is None:
        return None
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory(prefix="fedsim-throughput-") as scratch:
            return _timed_steps(_on_this_machine(plan, scratch), client, plan.clients[client], batches)
    finally:
        torch.set_num_threads(threads)


def _timed_steps(plan: WorkerPlan, client: int, data: ClientData, batches: int) -> float:
    runtime = ClientRuntime(plan, {client: data})
    batch = plan.cfg.train.batch_size
    runtime.loop.working_on(client, 1, "training")
    x, y = runtime.client_tensors(client, "train")
    generator = torch.Generator().manual_seed(0)
    runtime.sgd(x[:batch], y[:batch], PARTS["full"], 1, generator, 1)  # the first step pays for set-up and caches
    first = batch if len(x) > batch else 0  # a one-batch client: its batch timed again
    timed_x, timed_y = x[first:first + batch * batches], y[first:first + batch * batches]
    start = time.perf_counter()
    runtime.sgd(timed_x, timed_y, PARTS["full"], 1, generator, 1)
    return len(timed_x) / (time.perf_counter() - start)


def _on_this_machine(plan: RunPlan, scratch: str) -> WorkerPlan:
    """The workers' plan as this process can train it, writing under ``scratch``: on its CPU, so at full precision where the
    workers' is a GPU's (16-mixed has no CPU kernels); what the module does wrong depends on neither."""
    update: dict = {"out_dir": scratch}
    model = plan.cfg.model
    if plan.cfg.engine.gpus_per_worker > 0 and model.precision not in ("32", "32-true"):
        update["model"] = model.model_copy(update={"precision": "32"})
    return dataclasses.replace(plan.for_workers(), cfg=plan.cfg.model_copy(update=update))


def _one_step(plan: WorkerPlan, client: int, data: ClientData) -> None:
    runtime = ClientRuntime(plan, {client: data})
    batch = plan.cfg.train.batch_size
    runtime.loop.working_on(client, 1, "training")  # as round 1 trains it
    x, y = runtime.client_tensors(client, "train")
    runtime.sgd(x[:batch], y[:batch], PARTS["full"], 1, torch.Generator().manual_seed(0), 1)
    runtime.loop.logged.collect()
    x, y = runtime.client_tensors(client, "test")
    if len(y):
        runtime.loop.score(x[:batch], y[:batch], batch, "")
