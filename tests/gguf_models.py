"""GGUF files written the way llama.cpp's ``convert_hf_to_gguf.py`` writes them, from random-weight transformers
models: the ``gguf`` package's tensor names (``get_tensor_name_map``) and its standard metadata keys, the tensors in
llama.cpp's layouts (Llama's Q / K rows permuted for its rotary, GPT-2's Conv1D weights transposed, Gemma 2 / 3's
RMSNorm weights stored as ``1 + w``), fp32 or fp16.

``GGUF_ARCHITECTURES`` is the families transformers' GGUF reader (``transformers/integrations/ggml.py``) takes
back into the same model; what each cannot carry is said beside it (the reader fills those from the config's
defaults, so the tests' models keep the defaults there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: model_type -> the GGUF architecture llama.cpp writes it as (Mistral as ``llama``: read back as a Llama, the same
#: computation where the sliding window is no shorter than the cache).
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",  # head_dim = hidden / heads: the reader takes no attention.key_length for qwen3
    "phi3": "phi3",
    "gemma2": "gemma2",  # tied head: the architecture has no output tensor
    "gemma3_text": "gemma3",  # layer types: every sixth layer global, as llama.cpp assumes
    "falcon": "falcon",  # the 7B block (multi-query, parallel): the reader keeps no num_kv_heads
    "stablelm": "stablelm",
    "gpt2": "gpt2",  # n_positions 1024: the reader reads context_length as n_ctx, and the vocabulary's size
}


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of a Q / K projection (``LlamaModel.permute``; transformers undoes it on load)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _metadata(writer: Any, config: Any, arch: str) -> None:
    """The architecture's hyperparameters under the keys transformers' reader maps back to ``config``'s fields."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    for key, field in GGUF_CONFIG_MAPPING[arch].items():
        value = getattr(config, field, None) if field else None
        if field == "rope_theta":  # one rope, or Gemma 3's per layer type (the file holds the global one)
            rope = config.rope_parameters
            value = rope.get("full_attention", rope)["rope_theta"]
        if isinstance(value, bool):
            writer.add_bool(f"{arch}.{key}", value)
        elif isinstance(value, int):
            writer.add_uint32(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
    for token, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        value = getattr(config, f"{token}_token_id", None)
        if isinstance(value, int):
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    if "vocab_size" not in GGUF_CONFIG_MAPPING[arch]:  # GPT-2's size is its token list's
        writer.add_token_list([f"<{i}>" for i in range(config.vocab_size)])


def _llama_cpp_layout(hf_name: str, weight: np.ndarray, config: Any, arch: str) -> np.ndarray:
    if arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config.num_attention_heads if "q_proj" in hf_name else config.num_key_value_heads
        return _permute(weight, heads)
    if arch == "gpt2" and hf_name.endswith(("c_attn.weight", "c_fc.weight", "c_proj.weight")):
        return weight.T
    if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
        return weight + 1
    return weight


def write_gguf(model: Any, path: Path, dtype: Any = np.float32) -> Path:
    """``model`` (a causal LM of a ``GGUF_ARCHITECTURES`` family) as a GGUF file at ``path``, its matrices stored
    as ``dtype`` (vectors stay fp32, as llama.cpp's converter keeps them)."""
    import gguf

    config = model.config
    arch = GGUF_ARCHITECTURES[config.model_type]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    _metadata(writer, config, arch)
    key = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(key, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        weight = np.ascontiguousarray(_llama_cpp_layout(hf_name, tensor.detach().float().numpy(), config, arch))
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        writer.add_tensor(name, weight.astype(dtype if weight.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
