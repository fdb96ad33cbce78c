"""Character models for next-character prediction (``data.dataset: shakespeare``) as split networks.

Inputs arrive as the data layer hands every model its samples: (B, 1, 1, T) floats, here the character codes
themselves (fedsim.data.shakespeare stores them with mean 0 and std 1/255), which the stem rounds back to indices.
The last block ends at the last position, so ``features`` are (B, D) vectors as every method's head expects, and the
classifier is the output layer over the vocabulary (the personal head at K_P = 1).
"""
from __future__ import annotations

import torch
from torch import nn

from fedsim.models.shape import ImageSize, height_width
from fedsim.models.split import SplitNet


class CharacterCodes(nn.Module):
    """(B, 1, 1, T) float codes -> (B, T) int64 indices (rounded: ``to_float``'s scaling leaves them a hair off)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).round().long()


class LSTMLayer(nn.Module):
    """One LSTM layer over the sequence; ``last``: only its final position's output, (B, hidden)."""

    def __init__(self, width: int, hidden: int, last: bool):
        super().__init__()
        self.lstm = nn.LSTM(width, hidden, batch_first=True)
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return out[:, -1] if self.last else out


# model.options of each model: its sizes and their defaults (LEAF's LSTM; the transformer's own).
LSTM_SIZES = {"embedding": 8, "hidden": 256, "layers": 2}
TRANSFORMER_SIZES = {"width": 64, "heads": 4, "layers": 2}


def char_lstm(num_classes: int, in_channels: int = 1, image_size: ImageSize = (1, 80), embedding: int = 8,
              hidden: int = 256, layers: int = 2) -> SplitNet:
    """LEAF's Shakespeare model (models/shakespeare/stacked_lstm.py): an embedding of 8 per character, two stacked
    LSTM layers of 256 and a linear output over the vocabulary from the last position."""
    stem = nn.Sequential(CharacterCodes(), nn.Embedding(num_classes, embedding))
    blocks = [LSTMLayer(embedding if i == 0 else hidden, hidden, last=i == layers - 1) for i in range(layers)]
    return SplitNet(stem, blocks, nn.Linear(hidden, num_classes))


class PositionalEmbedding(nn.Module):
    """Character embedding plus a learned embedding of each position."""

    def __init__(self, vocabulary: int, width: int, length: int):
        super().__init__()
        self.characters = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(length, width)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.characters(codes) + self.positions(torch.arange(codes.shape[1], device=codes.device))


class CausalLayer(nn.Module):
    """A pre-norm transformer layer where each position attends to itself and the positions before it;
    ``last``: only the final position, layer-normed, (B, width)."""

    def __init__(self, width: int, heads: int, last: bool):
        super().__init__()
        # dropout 0: the model the Shakespeare pages' runs trained (a client's dropout draws would be seeded per client
        # and round: fedsim.client.randomness.global_draws).
        self.layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                norm_first=True)
        self.norm = nn.LayerNorm(width) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=x.dtype)
        out = self.layer(x, src_mask=mask, is_causal=True)
        return out if self.norm is None else self.norm(out[:, -1])


def char_transformer(num_classes: int, in_channels: int = 1, image_size: ImageSize = (1, 80), width: int = 64,
                     heads: int = 4, layers: int = 2) -> SplitNet:
    """A small causal character transformer: learned character and position embeddings, ``layers`` pre-norm
    layers, a linear output over the vocabulary from the last position."""
    length = height_width(image_size)[1]
    stem = nn.Sequential(CharacterCodes(), PositionalEmbedding(num_classes, width, length))
    blocks = [CausalLayer(width, heads, last=i == layers - 1) for i in range(layers)]
    return SplitNet(stem, blocks, nn.Linear(width, num_classes))
