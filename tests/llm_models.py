"""Tiny causal LMs built from transformers configs with random weights (never downloaded).

2 layers, hidden 64, vocab 500; ``initializer_range`` 0.2 so that greedy tokens vary (FACTS.md).
Llama: RoPE, RMSNorm, grouped-query attention (4 heads over 2 KV heads), SwiGLU, untied head;
``llama-tied`` ties it. Qwen2: QKV bias. GPT-2: learned positions, multi-head attention, Conv1D.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 500
ARCHITECTURES = ("llama", "qwen2", "gpt2")


def tiny_causal_lm(arch: str) -> Any:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = {"vocab_size": VOCAB, "initializer_range": 0.2}
    llama_like = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    if arch in ("llama", "llama-tied"):
        config = tf.LlamaConfig(**common, **llama_like, tie_word_embeddings=arch == "llama-tied")
        return tf.LlamaForCausalLM(config).eval()
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**common, **llama_like)).eval()
    if arch == "gpt2":
        config = tf.GPT2Config(
            **common, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
        )
        return tf.GPT2LMHeadModel(config).eval()
    raise ValueError(arch)


def save_tiny_causal_lm(arch: str, directory: Path) -> Path:
    """The model as a transformers directory (config.json + model.safetensors)."""
    tiny_causal_lm(arch).save_pretrained(directory)
    return directory


def transformers_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` (with its cache), never stopping early."""
    import torch

    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]
