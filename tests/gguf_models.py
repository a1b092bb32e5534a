"""GGUF files written the way llama.cpp's ``convert_hf_to_gguf.py`` writes them (its tensor names, Q/K rows
permuted for its rotary layout, fp32 or fp16 tensors), from random-weight transformers models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of a Q / K projection (``LlamaModel.permute``; transformers undoes it on load)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_llama_gguf(model: Any, path: Path, dtype: Any = np.float32) -> Path:
    """``model`` (a ``LlamaForCausalLM``) as a GGUF file at ``path``, its tensors stored as ``dtype``."""
    import gguf

    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        weight = tensor.detach().float().numpy()
        if hf_name.endswith("q_proj.weight"):
            weight = _permute(weight, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            weight = _permute(weight, config.num_key_value_heads)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        # 1-D tensors (norms) stay fp32, as llama.cpp's converter keeps them
        writer.add_tensor(name, weight.astype(dtype if weight.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
