"""A BERT-base-sized encoder (12 layers, hidden 768, 12 heads) with random weights, for benchmarks.

Same interface as examples/minilm.py (token ids + attention mask in, a normalised mean-pooled
embedding out) so the two can be compared; the weights are seeded, never downloaded.
"""

from __future__ import annotations

import torch
from torch import nn

DYNAMIC_DIMS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
OUTPUT_NAMES = ["embedding"]
VOCAB = 30522
INPUT_RANGES = {"input_ids": (0, VOCAB - 1)}


class Encoder(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def get_model() -> nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, attn_implementation="eager")
    return Encoder(BertModel(config, add_pooling_layer=False)).eval()


def get_example_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 32), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
