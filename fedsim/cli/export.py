"""``fedsim export RUN [--round N] [--clients ...] [--fine-tuned] [--out DIR]``: each client's complete model out of a
run folder, as the client module names its parameters.

A client's model is its shared part (the checkpoint's global weights, what ``model.npz`` holds at the end) joined
with its personal part (its row of the checkpoint's per-client state), loaded exactly as evaluation loads it
(the method's ``load_for_evaluation``: Ditto's own model, IFCA's cluster, ...). ``--fine-tuned``: the model the
protocol scores as personalized, fine-tuned again here rather than saved by every evaluation (a model per client
per evaluation round would be most of a run folder): evaluation's fine-tuning is a function of the run's seed,
the round and the client (``client/randomness``), so running that same code on the same checkpoint gives the same
model, and the export scores it and prints the accuracy beside the one the run logged as the check.

Per client, ``client-<c>.pt`` (``torch.save`` of the module's ``state_dict()``) and ``client-<c>.ckpt`` (a
Lightning checkpoint: ``YourModule.load_from_checkpoint(path)``; its ``hyper_parameters`` are the arguments fedsim
built the module with). A run folder is input: code its config names is imported only with ``--trust-plugins``."""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.core import runfiles
from fedsim.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from fedsim.algorithms.context import ClientContext
    from fedsim.client.runtime import ClientRuntime
    from fedsim.config import RunConfig

STAGES = {False: "initial", True: "fine_tuned"}  # --fine-tuned -> the stage evaluation tells (``ModelSeen``)
METRIC = {False: "acc", True: "acc_personalized"}  # the accuracy each stage is scored as (core.protocol.ACCURACIES)


def export_command(args: argparse.Namespace) -> int:
    from fedsim import safe_files, storage
    from fedsim.engine.runfolder_checks import load_run_config

    if storage.is_uri(args.run) and not args.out:
        raise ConfigError(f"--out: {args.run} is in an object store; give a local folder for the exported models")
    refuse_bad_out(args.out)
    if not args.out and not storage.is_uri(args.run):  # refused before the run is read, as again when written
        safe_files.refuse_linked_folder(Path(args.run, runfiles.EXPORT), Path(args.run))
    refuse_other_overrides(args.overrides)
    # A plug-in the folder names needs the trust, or the same plug-in string given on the command line.
    cfg = load_run_config(args.run, args.overrides, args.trust_plugins, "fedsim export")
    if args.fine_tuned and not cfg.eval.personalizes:
        raise ConfigError(f"--fine-tuned: {args.run} does not personalize at evaluation (eval.personalize="
                          f"{cfg.eval.personalize}, eval.finetune_epochs={cfg.eval.finetune_epochs}); export without "
                          "--fine-tuned")
    clients = _clients(args.clients, cfg.data.num_clients)
    for line in export(cfg, args.round, clients, args.fine_tuned, args.out):
        print(line)
    return 0


def refuse_bad_out(out: str | None) -> None:
    """--out names a folder: refused in one line when it is empty, or names something else than a folder, before
    the run is read (not as an errno once every client's model is built)."""
    if out is None:
        return
    if not out.strip() or "\n" in out:
        raise ConfigError(f"--out: {out!r} is not a folder name; give the folder for the exported models")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out: {out} exists and is not a folder; give a folder (new or existing)")


def refuse_other_overrides(overrides: list[str]) -> None:
    """Export takes on its command line only the plug-ins the run's config names (``model.client=pkg.mod:Cls``),
    the way to trust that code without --trust-plugins; any other key would change the run it exports."""
    from fedsim.config import parse_overrides
    from fedsim.plugins import plugin_settings

    for pair in overrides:
        key = pair.partition("=")[0].strip()
        if not plugin_settings(parse_overrides([pair])):
            raise ConfigError(f"{key}: fedsim export takes only the plug-ins the run's config names (e.g. "
                              "model.client=my_module:MyModule), to trust that code; export the run as it ran")


def _clients(given: list[int] | None, num_clients: int) -> list[int]:
    if not given:
        return list(range(num_clients))
    wrong = [c for c in given if not 0 <= c < num_clients]
    if wrong:
        raise ConfigError(f"--clients: {wrong[0]} is not a client of this run (0 .. {num_clients - 1})")
    return sorted(set(given))


def round_checkpoint(run_dir: Path, round_idx: int | None) -> Path:
    """The intact checkpoint of round ``round_idx`` (None: the newest) in ``run_dir``; refused in one line naming the
    rounds that are kept where that round is not."""
    from fedsim.core import checkpoint

    if round_idx is None:
        found = checkpoint.latest(run_dir)
        if found is None:
            raise ConfigError(f"{run_dir}: no intact checkpoint to export from (engine.checkpoint_every=0, or the run "
                              "has not finished a round)")
        return found
    kept = kept_rounds(run_dir)
    if round_idx not in kept:
        rounds = ", ".join(str(r) for r in kept) or "none"
        raise ConfigError(f"--round: round {round_idx} is not kept in {run_dir / runfiles.CHECKPOINTS} (rounds kept: "
                          f"{rounds}; a run keeps its last {checkpoint.KEEP} checkpoints); export one of those")
    return run_dir / runfiles.CHECKPOINTS / f"round-{round_idx:04d}"


def kept_rounds(run_dir: Path) -> list[int]:
    """The rounds whose checkpoints ``run_dir`` holds intact, oldest first."""
    from fedsim.core import checkpoint

    folders = (run_dir / runfiles.CHECKPOINTS).glob("round-*")
    return sorted(r for p in folders if (r := checkpoint.round_of(p)) is not None and checkpoint.intact(p))


def export(cfg: RunConfig, round_idx: int | None, clients: list[int], fine_tuned: bool,
           out: str | None) -> list[str]:
    """Write each of ``clients``' models at ``round_idx`` (None: the newest checkpoint); one line per client with
    what it wrote and the accuracy it scored beside the one the run logged."""
    from fedsim.client.runtime import ClientRuntime
    from fedsim.core import checkpoint
    from fedsim.engine.runfolder import RunFolder
    from fedsim.engine.runfolder_checks import check_checkpoint, open_for_resume
    from fedsim.plan.build import build_plan, load_inputs

    inputs = load_inputs(cfg)
    folder = RunFolder(cfg)
    partition, _ = open_for_resume(folder, inputs.data)  # the run's own partition, over the data it started with
    plan = build_plan(cfg, inputs, partition)
    ckpt = round_checkpoint(folder.local, round_idx)
    check_checkpoint(ckpt, plan)  # this run's settings and partition
    done = checkpoint.round_of(ckpt)
    assert done is not None  # a round-N folder
    target = export_folder(folder.local, out, f"round-{done:04d}{'-fine-tuned' if fine_tuned else ''}")
    runtime = ClientRuntime(plan.for_workers(), {c: plan.clients[c] for c in clients})
    runtime.load_state(str(ckpt))
    state = server_state(ckpt, plan.model.layouts["shared"].size, plan.fingerprint)
    logged = logged_accuracies(folder.local, done, METRIC[fine_tuned])
    lines = []
    for client in clients:
        broadcast = next(vectors for members, vectors in plan.algorithm.broadcast_groups(state, [client], False)
                         if client in members)
        saved: dict[str, Any] = {}
        [record] = runtime.evaluation.evaluate(broadcast, [client], done, _take(runtime, STAGES[fine_tuned], saved))
        files = write_client(runtime, saved["state_dict"], target, client, cfg)
        columns: Mapping[str, Any] = record  # read by the stage's column name
        scored, was = columns[METRIC[fine_tuned]], logged.get(client)
        check = f"the run logged {100 * was:.2f}%" if was is not None else f"round {done} was not evaluated"
        lines.append(f"client {client}: {', '.join(str(f) for f in files)} ({METRIC[fine_tuned]} {100 * scored:.2f}%; "
                     f"{check})")
    return lines


def export_folder(run_dir: Path, out: str | None, name: str) -> Path:
    """The folder the models go to, made: ``out``, or ``RUN/export/<name>``, whose folders inside the run folder
    are refused when they are links (the files would land outside the run folder under paths printed inside it)."""
    from fedsim import safe_files

    if out:
        return safe_files.make_folder(Path(out), Path(out), "--out")
    return safe_files.make_folder(run_dir / runfiles.EXPORT / name, run_dir)


def _take(runtime: ClientRuntime, stage: str, saved: dict[str, Any]) -> Callable[[ClientContext, str], None]:
    """Keeps the module's state at ``stage`` of evaluation; refuses a model the network alone does not score."""
    def seen(ctx: ClientContext, at: str) -> None:
        if at != stage:
            return
        if ctx.logit_adjustment is not None:
            raise ConfigError(f"algorithm {runtime.algorithm.name}: scores each client with its own logits beside the "
                              "network's (ClientContext.score_with), so the network alone is not the scored model; "
                              "fedsim export cannot write it")
        saved["state_dict"] = {k: v.detach().cpu().contiguous().clone()
                               for k, v in runtime.loop.module.state_dict().items()}
    return seen


def server_state(ckpt: Path, shared_size: int, fingerprint: str) -> dict[str, Any]:
    """The server's state at the checkpoint, as the server restores it (without FedBuff's older models)."""
    from fedsim.core import checkpoint
    from fedsim.core.protocol import WEIGHTS
    from fedsim.engine.fedbuff import MODEL_PREFIX

    _, weights, other = checkpoint.read_state(ckpt, fingerprint, shared_size)
    return {WEIGHTS: weights, **{name: v for name, v in other.items() if not name.startswith(MODEL_PREFIX)}}


def logged_accuracies(run_dir: Path, round_idx: int, metric: str) -> dict[int, float]:
    """Each client's ``metric`` at ``round_idx`` as metrics.jsonl holds it (empty where that round was not scored)."""
    from fedsim.core.results import read_results

    path = run_dir / runfiles.METRICS
    logged = {}
    for number, row in enumerate(read_results(path), start=1):  # the strict reader: a bad line is named, not skipped
        if row.get("round") != round_idx or metric not in row:
            continue
        client, value = row.get("client"), row[metric]
        if type(client) is not int or not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}:{number}: not a client record (client {client!r}, {metric} {value!r}); "
                              "restore the file from the run")
        logged[client] = float(value)
    return logged


def write_client(runtime: ClientRuntime, state_dict: dict[str, torch.Tensor], target: Path, client: int,
                 cfg: RunConfig) -> list[Path]:
    """``client-<c>.pt`` (the state dict) and ``client-<c>.ckpt`` (a Lightning checkpoint), written whole."""
    import io

    import pytorch_lightning as pl
    import torch

    from fedsim import atomic

    module = runtime.loop.module
    lightning = {"state_dict": state_dict, "pytorch-lightning_version": pl.__version__, "epoch": 0, "global_step": 0,
                 pl.LightningModule.CHECKPOINT_HYPER_PARAMS_KEY: hyper_parameters(module, cfg, runtime)}
    files = [target / f"client-{client}.pt", target / f"client-{client}.ckpt"]
    for path, payload in zip(files, (state_dict, lightning)):
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        atomic.write_bytes(path, buffer.getvalue())
    return files


def hyper_parameters(module: Any, cfg: RunConfig, runtime: ClientRuntime) -> dict[str, Any]:
    """What ``load_from_checkpoint`` builds the module with: the arguments fedsim built it with, and what the module
    saved itself (``save_hyperparameters``). FedClient's ``net`` is a module: given at load time instead."""
    from fedsim.models.lightning import client_arguments

    built = client_arguments(type(module), cfg.model, runtime.plan.num_classes, runtime.plan.input_shape)
    return {**built, **dict(module.hparams)}
