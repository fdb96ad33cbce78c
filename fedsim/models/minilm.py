"""``model.name: minilm``: sentence-transformers' all-MiniLM-L6-v2 encoder, frozen, with LoRA adapters and a
classifier head trained (``model.options``: r, alpha, dropout, target_modules).

The encoder is read once per process (:func:`pretrained_encoder`, the ``text`` extra's files, sha256-checked, with
the hub's offline switches forced before any Hugging Face import) and every model built in that process shares its
tensors: a worker hosts one network whatever its client count, and a driver that builds the model twice does not
read the weights twice. In a built model the pretrained weights are *non-persistent buffers*, not parameters: no
optimizer can reach them, and they are in no state dict, so they are neither in the layouts a run federates nor in
any upload; only the adapters and the head are (``fedsim.models.state.frozen_values`` counts what stays behind).

Inputs are token ids as the data layer hands every model its samples, (B, 1, 1, T) floats rounded back to
indices; id 0 (BERT's [PAD]) is padding, masked out of attention and of the mean pooling.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsim.core.pretrained import SHA256, checked_file, force_offline, minilm_folder
from fedsim.models.shape import ImageSize
from fedsim.models.split import SplitNet
from fedsim.models.text import CharacterCodes

if TYPE_CHECKING:  # transformers loads only after the offline switches are set
    from transformers import BertModel

PADDING_ID = 0  # BERT's [PAD]
# model.options and their defaults (fedsim.models.OPTIONS); the function's own defaults are these.
MINILM_OPTIONS = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ("query", "value")}


@lru_cache(maxsize=1)
def pretrained_encoder() -> BertModel:
    """The pretrained BertModel, loaded once per process from the checked files, every weight frozen. Its dropout is
    0, so its features are the pretrained model's; LoRA's own dropout is an option."""
    force_offline()  # before transformers (and the hub client it imports) read their switches
    for name in SHA256:
        checked_file(name)
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the checkpoint's pooler weights, which mean pooling does not use
    hf_logging.disable_progress_bar()  # a bar per load, in every worker's log
    folder = minilm_folder()
    config = BertConfig.from_pretrained(folder, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    # use_kernels=False: the same torch kernels in every process, none fetched from the hub (USE_HUB_KERNELS says so too)
    encoder = BertModel.from_pretrained(folder, config=config, add_pooling_layer=False, use_kernels=False)
    return encoder.requires_grad_(False).eval()


def linear_names(encoder: nn.Module) -> set[str]:
    """The last name of every linear layer: what LoRA's target_modules match."""
    return {name.rsplit(".", 1)[-1] for name, m in encoder.named_modules() if isinstance(m, nn.Linear)}


def check_options(r: int, alpha: int, dropout: float, target_modules: Sequence[str], linears: set[str]) -> None:
    """Each LoRA option's range, as a one-line ValueError naming it."""
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"model.options.r: {r!r} is no LoRA rank; give a whole number >= 1 (e.g. 8)")
    if isinstance(alpha, bool) or not isinstance(alpha, int) or alpha < 1:
        raise ValueError(f"model.options.alpha: {alpha!r} is no LoRA scale; give a whole number >= 1 (e.g. 16)")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"model.options.dropout: {dropout!r} is no dropout rate; give a number in [0, 1)")
    if isinstance(target_modules, str) or not isinstance(target_modules, Sequence):
        raise ValueError(f"model.options.target_modules: {target_modules!r} is not a list; give names of the "
                         f"encoder's linear layers, e.g. [query, value]")
    unknown = [t for t in target_modules if t not in linears]
    if unknown:
        raise ValueError(f"model.options.target_modules: {unknown[0]!r} is no linear layer of MiniLM's encoder; "
                         f"choose among {', '.join(sorted(linears))} ([] trains the head alone)")


def freeze_as_constants(module: nn.Module) -> None:
    """Every parameter that does not train becomes a non-persistent buffer (the same tensor): out of every state
    dict, optimizer and upload, still moved with the module to its device."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and not param.requires_grad:
                delattr(sub, name)
                sub.register_buffer(name, param.detach(), persistent=False)


class MeanPooledEncoder(nn.Module):
    """(B, T) token ids -> (B, hidden): the encoder's last hidden states averaged over the non-padding positions,
    as sentence-transformers pools all-MiniLM-L6-v2."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids != PADDING_ID).long()
        hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        # an all-padding sequence pools to zeros (the clamp keeps it from dividing by zero)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def minilm(num_classes: int, in_channels: int = 1, image_size: ImageSize = (1, 32), r: int = 8, alpha: int = 16,
           dropout: float = 0.0, target_modules: Sequence[str] = ("query", "value")) -> SplitNet:
    """The frozen all-MiniLM-L6-v2 encoder with PEFT LoRA adapters of rank ``r`` (scale ``alpha / r``) on
    ``target_modules`` (empty: none, the head trains alone), mean pooling, and a linear classifier."""
    shared = pretrained_encoder()
    check_options(r, alpha, dropout, target_modules, linear_names(shared))
    # New modules over the same tensors: a model's adapters are its own, the pretrained weights are the process's.
    bert = copy.deepcopy(shared, memo={id(t): t for t in [*shared.parameters(), *shared.buffers()]})
    if target_modules:
        from peft import LoraConfig, inject_adapter_in_model

        inject_adapter_in_model(LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                           target_modules=list(target_modules)), bert)
    freeze_as_constants(bert)
    return SplitNet(CharacterCodes(), [MeanPooledEncoder(bert)], nn.Linear(shared.config.hidden_size, num_classes))
