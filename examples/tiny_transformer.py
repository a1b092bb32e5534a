"""A two-layer transformer encoder with random weights, token ids in and pooled features out."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 1000
DYNAMIC_DIMS = {"input_ids": {0: "batch", 1: "seq"}}
OUTPUT_NAMES = ["features"]


class TinyTransformer(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.encoder(self.embed(input_ids))).mean(dim=1)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyTransformer().eval()


def get_example_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))}
