"""Tiny causal LMs built from transformers configs with random weights (never downloaded).

2 layers, hidden 64, vocab 500; ``initializer_range`` 0.2 so that greedy tokens vary (FACTS.md).
Llama: RoPE, RMSNorm, grouped-query attention (4 heads over 2 KV heads), SwiGLU, untied head;
``llama-tied`` ties it. Qwen2: QKV bias. GPT-2: learned positions, multi-head attention, Conv1D.

Also what the text-generation tests share: the build geometry (``MAX_SEQ``, batch 2), the two prompts of
different lengths, left-padded as a tokenizer pads them, and the token-for-token check against transformers.
The tiny Llama's artifacts themselves are session fixtures in ``tests/conftest.py`` (built once a run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.in_process import ISOLATE_BACKEND

VOCAB = 500
ARCHITECTURES = ("llama", "qwen2", "gpt2")
#: The cache length and batch every tiny text-generation artifact is built with.
MAX_SEQ = 64
MAX_BATCH = 2
#: Two prompts of different lengths (a batch of them is left-padded) and how many tokens to generate after them.
PROMPTS = ([5, 17, 42, 99, 3, 250, 7], [8, 1, 300])
NEW = 20
#: The verify width the shared artifacts are built with (speculative decoding).
SPECULATIVE_K = 4
#: tvm: two prefill buckets, not three (the prompts of 3 and 7 tokens share 16; validation's 17 takes 64).
TVM_BUCKETS = {"buckets": ("prompt=16/64",)}


_COMMON = {"vocab_size": VOCAB, "initializer_range": 0.2}
_LLAMA_LIKE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def tiny_llama(seed: int = 0, **config: Any) -> Any:
    """The tiny Llama (``tiny_causal_lm("llama")``) with ``config`` overriding its ``LlamaConfig`` values."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**{**_COMMON, **_LLAMA_LIKE, **config})).eval()


def tiny_causal_lm(arch: str) -> Any:
    import torch
    import transformers as tf

    if arch in ("llama", "llama-tied"):
        return tiny_llama(tie_word_embeddings=arch == "llama-tied")
    torch.manual_seed(0)
    common, llama_like = _COMMON, _LLAMA_LIKE
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
    """transformers' forward over its own cache, the argmax each step, never stopping early. Not
    ``generate(min_new_tokens=...)``: that forbids the end-of-sequence token, which a random model's greedy path may
    pick (and an artifact, asked for ``new_tokens`` tokens, then does)."""
    import torch

    tokens: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(new_tokens):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens


#: The export cache this run's text-generation builds share (``generative.export_cache``; set by tests/conftest.py):
#: a tiny model exported for the same attention and geometry by several tests is exported once.
EXPORT_CACHE: list[Path] = []


def build_text_generation(model: Any, out: Path, target: str = "onnxruntime", **kw: Any) -> Any:
    """``aotforge.build`` of a causal LM at the tests' geometry, without the benchmark unless asked, through the
    run's export cache (``export_cache_dir=None`` exports afresh)."""
    import aotforge

    kw = {
        "bench": False,
        "max_seq_len": MAX_SEQ,
        "max_batch": MAX_BATCH,
        "isolate_backend": ISOLATE_BACKEND,
        "export_cache_dir": EXPORT_CACHE[0] if EXPORT_CACHE else None,
        **kw,
    }
    return aotforge.build(model, target=target, task="text-generation", out=out, **kw)


def left_padded(prompts: tuple[list[int], ...] = PROMPTS) -> tuple[np.ndarray, np.ndarray]:
    """The prompts as one batch: ids and attention mask, left-padded with zeros."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = p, 1
    return ids, mask


def assert_generates_like_transformers(runner: Any, model: Any) -> None:
    """A batch of the two prompts through ``runner.generate`` == transformers' greedy generate per prompt."""
    from aotforge.artifacts.loader import LoadedArtifact

    ids, mask = left_padded()
    # A loaded artifact stops at the model's own eos by default; a bare runner knows no model defaults and runs on.
    run_on = {"ignore_eos": True} if isinstance(runner, LoadedArtifact) else {}
    out = runner.generate(ids, NEW, attention_mask=mask, **run_on)
    assert out.shape == (2, ids.shape[1] + NEW)
    np.testing.assert_array_equal(out[:, : ids.shape[1]], ids)
    for row, prompt in enumerate(PROMPTS):
        want = transformers_greedy(model, prompt, NEW)
        assert out[row, ids.shape[1] :].tolist() == want
        assert len(set(want)) > 3, "random weights should not repeat one token (initializer_range)"


def assert_python_collectives_token_exact(artifact: Any, model: Any, monkeypatch: Any) -> None:
    """Without a C compiler a sharded artifact's ranks run the collectives' Python op, token-exact."""
    import aotforge
    from aotforge.core.errors import TargetUnavailableError
    from aotforge.targets.onnxruntime import native_all_reduce

    def no_compiler() -> str:
        raise TargetUnavailableError("no C compiler here")

    monkeypatch.setattr(native_all_reduce, "compiler", no_compiler)
    loaded = aotforge.load(artifact)
    try:
        assert loaded._generative().engine.group.collective.startswith("python op")
        assert_generates_like_transformers(loaded, model)
    finally:
        loaded._generative().engine.close()


def assert_build_token_exact(result: Any, model: Any) -> None:
    """A build validated token for token (its manifest says so) and generates as transformers does."""
    import aotforge

    assert result.manifest.validation["token_agreement"] == 1.0
    assert result.manifest.validation["max_logits_rel_l2"] < 1e-4
    assert_generates_like_transformers(aotforge.load(result.path), model)
