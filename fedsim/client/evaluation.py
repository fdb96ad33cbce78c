"""The evaluation protocol, FedBABU's for every algorithm: each client's *initial* accuracy, of the model it is
scored with, and its *personalized* accuracy, after personalizing that model on its own training data; each on
the client's test data and, with data.validation, on its validation split by the same protocol."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch

from fedsim.algorithms import PARTS
from fedsim.algorithms.base import Algorithm
from fedsim.algorithms.context import AdjustedModule, ClientContext, LogitAdjustment, RuntimePort
from fedsim.client.loop import LocalLoop, ScoringStage
from fedsim.client.logged import recorded
from fedsim.client.randomness import FINETUNE_STREAM, client_generator, global_draws
from fedsim.config import RunConfig
from fedsim.core.protocol import ClientData, ClientRecord, add_columns, on_validation

EVAL_BATCH = 500
# Told each client's model as it is scored: (its context, "initial" once loaded, "fine_tuned" once personalized).
ModelSeen = Callable[[ClientContext, str], None]


class Evaluation:
    """Scores a worker's clients through its runtime port and its loop."""

    def __init__(self, port: RuntimePort, loop: LocalLoop, algorithm: Algorithm, cfg: RunConfig,
                 client_data: Mapping[int, ClientData], perplexity: bool = False):
        self.port, self.loop, self.algorithm = port, loop, algorithm
        self.cfg, self.client_data = cfg, client_data
        self.perplexity = perplexity  # text (next-character prediction): each score's perplexity beside its loss

    def _batch(self, n: int) -> int:
        """Batch statistics depend on the batch: score a client's whole test set at once, as FedBABU's authors."""
        return n if self.algorithm.bn_mode == "batch_stats" else EVAL_BATCH

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(mean loss, accuracy) of the model as it is on (x, y), in evaluation mode."""
        loss, acc, _ = self.loop.score(x, y, self._batch(len(y)), "")
        return loss, acc

    def _record(self, client: int, suffix: str = "") -> dict[str, float]:
        """The model as it is, scored on the client's test data and, where it has a validation split
        (data.validation), on that too: the same model, so validation picks what test then reports."""
        rec = self._scored(client, "test", suffix)
        if len(self.client_data[client].val):
            rec |= {on_validation(key): value for key, value in self._scored(client, "val", suffix).items()}
        return rec

    def _scored(self, client: int, split: str, suffix: str) -> dict[str, float]:
        """With data.validation, a module's validation_step runs on the validation split and its test_step on test,
        as Lightning runs them; without, both steps score the test data (there is no other)."""
        x, y = self.port.client_tensors(client, split)
        stage: ScoringStage = ("evaluation" if not self.cfg.data.validation else
                               "validation" if split == "val" else "test")
        loss, acc, logged = self.loop.score(x, y, self._batch(len(y)), suffix, stage)
        # Per character: the exponential of the mean cross-entropy, what language-model users compare.
        ppl = {f"perplexity{suffix}": float(np.exp(loss))} if self.perplexity else {}
        return {f"loss{suffix}": loss, f"acc{suffix}": acc, **ppl, **logged}

    def evaluate(self, broadcast: dict[str, np.ndarray], clients: list[int], round_idx: int,
                 seen: ModelSeen | None = None) -> list[ClientRecord]:
        """Every client's record. Personalizing works on the loaded copy and is never packed back. A module's
        validation_step / test_step logs join the record (``_personalized`` after personalizing, what it logs while
        personalizing ``_finetune``). ``seen``: told each model as it is scored (``fedsim export`` takes it there, so
        an exported model is the one the protocol scored, fine-tuned the same way)."""
        results = []
        for client in clients:
            cd = self.client_data[client]
            self.loop.working_on(client, round_idx, "evaluation")
            gen = client_generator(self.cfg.seed, round_idx, client, FINETUNE_STREAM)
            ctx = ClientContext(self.port, client, round_idx, broadcast, gen)
            self.algorithm.load_for_evaluation(ctx)
            if seen is not None:
                seen(ctx, "initial")
            with self._adjusted_logits(ctx.logit_adjustment, ctx.logit_adjustment_on):
                rec: ClientRecord = {"client": client, "n_train": len(cd.train), "n_test": len(cd.test)}
                if len(cd.val):
                    rec["n_validation"] = len(cd.val)
                add_columns(rec, self._record(client))
                add_columns(rec, recorded(self.algorithm.name, ctx.recorded))  # a second score of the method's (FedProto's)
                if self.cfg.eval.personalizes:
                    with global_draws(self.cfg.seed, round_idx, client, FINETUNE_STREAM):
                        self._personalize(ctx, gen)
                    if seen is not None:
                        seen(ctx, "fine_tuned")
                    add_columns(rec, self.loop.logged.collect("_finetune"))
                    add_columns(rec, self._record(client, "_personalized"))
            results.append(rec)
        return results

    def _personalize(self, ctx: ClientContext, gen: torch.Generator) -> None:
        """eval.personalize: finetune runs eval.finetune_epochs of the fine-tuning optimizer on eval.finetune_part;
        own_update runs the method's own client hook from the global model and the client's own state, at train's
        settings, as FedRep's authors score FedRep. Its uploads and staged state are dropped: nothing of it is kept."""
        ecfg = self.cfg.eval
        if ecfg.personalize == "own_update":
            self.algorithm.client_update(ClientContext(self.port, ctx.client, ctx.round, ctx.broadcast, gen))
            return
        self.algorithm.before_finetuning(ctx)
        x, y = ctx.data()
        self.port.sgd(x, y, PARTS[ecfg.finetune_part], ecfg.finetune_epochs, gen, ctx.round, finetune=True)

    @contextmanager
    def _adjusted_logits(self, adjust: LogitAdjustment | None, on: AdjustedModule) -> Iterator[None]:
        """A method's scoring logits (``ClientContext.score_with``) for one client's evaluation, then the network's own."""
        if adjust is None:
            yield
            return
        module = self.port.output_layer if on == "output_layer" else self.port.net
        handle = module.register_forward_hook(lambda _, inputs, logits: adjust(inputs[0], logits))
        try:
            yield
        finally:
            handle.remove()
