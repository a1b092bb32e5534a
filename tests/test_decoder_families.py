"""Decoder families a user brings, on both CPU targets: greedy tokens equal transformers' own, never an internal error.

Each configuration is a transformers causal LM built from its config with random weights (``initializer_range``
0.2, tests/llm_models.py), at sizes chosen to vary what the families vary: hidden sizes off the powers of two,
head_dim != hidden / heads, one KV head up to multi-head, tied and untied heads, biases, learned positions and
post-norm (OPT), the embedding / residual / attention / logit multipliers (Granite). The default run builds one
configuration per family and target (those of issue 32's table: each failed before); the wider sweep (and
Mistral, Qwen3, GPT-NeoX, StableLM) is slow.

Beside the builds, each check that failed, on a graph or config of its own (no export, a few seconds): the tvm
residual-into-panel rewrite declines an embedding lookup's ``panel_rows`` call, ORT's GroupQueryAttention keeps
rotary out where its CPU kernel refuses the tables and is not the attention at all where it refuses the head_dim,
the logits are scaled as the family's ``forward`` scales them; and a sliding window shorter than the cache is
refused before the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aotforge.compiler.generative.graphs import kv_shape
from tests.llm_models import TVM_BUCKETS, VOCAB, assert_build_token_exact, build_text_generation

TARGETS = ("onnxruntime", "tvm")
_COMMON = {"vocab_size": VOCAB, "initializer_range": 0.2}
_LLAMA_LIKE = {"num_hidden_layers": 2, "intermediate_size": 160}

#: name -> (family, config values). Widths and heads per name: ``96x4`` is hidden 96 over 4 heads.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # GPT-2 at head_dim 24, tied head: the tied embedding's lookup plus positions met the residual rewrite.
    "gpt2-120x5": ("gpt2", {"n_embd": 120, "n_head": 5}),
    "gpt2-128x4": ("gpt2", {"n_embd": 128, "n_head": 4}),
    "gpt2-96x3-untied": ("gpt2", {"n_embd": 96, "n_head": 3, "tie_word_embeddings": False}),
    # Gemma: head_dim set apart from hidden / heads; one KV head (multi-query) up to multi-head.
    "gemma-96x4-d40-kv1": (
        "gemma",
        {"hidden_size": 96, "num_attention_heads": 4, "head_dim": 40, "num_key_value_heads": 1},
    ),
    "gemma-80x2-d48-mha": (
        "gemma",
        {"hidden_size": 80, "num_attention_heads": 2, "head_dim": 48, "num_key_value_heads": 2},
    ),
    "gemma-112x4-d24-kv2": (
        "gemma",
        {"hidden_size": 112, "num_attention_heads": 4, "head_dim": 24, "num_key_value_heads": 2},
    ),
    # Phi-3: one fused qkv projection, one fused gate / up.
    "phi3-96x4-kv2": ("phi3", {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}),
    "phi3-80x5-mha": ("phi3", {"hidden_size": 80, "num_attention_heads": 5, "num_key_value_heads": 5}),
    "phi3-128x4-kv1-tied": (
        "phi3",
        {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    # Granite: its four multipliers, logits_scaling among them.
    "granite-96x4-kv2": ("granite", {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}),
    # head_dim 20: ORT's GroupQueryAttention refuses it, so the onnxruntime build's attention is the plain one.
    "granite-120x6-kv3-tied": (
        "granite",
        {
            "hidden_size": 120,
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
            "tie_word_embeddings": True,
            "embedding_multiplier": 1.0,
        },
    ),
    "granite-64x4-mha-bias": (
        "granite",
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "attention_bias": True,
            "mlp_bias": True,
        },
    ),
    # The families issue 32 found exact, kept so: QK norms (Qwen3), parallel residual and partial rotary
    # (GPT-NeoX, StableLM), a sliding window no shorter than the cache (Mistral).
    "mistral-96x4-kv2": ("mistral", {"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}),
    "qwen3-80x4-d32-kv2": (
        "qwen3",
        {"hidden_size": 80, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},
    ),
    "gpt_neox-96x3-rot25": (
        "gpt_neox",
        {"hidden_size": 96, "num_attention_heads": 3, "rotary_pct": 0.25, "tie_word_embeddings": False},
    ),
    "stablelm-96x4-qkv-bias": (
        "stablelm",
        # no end token: StableLM's default (0) is a token transformers' min_new_tokens would keep it from choosing
        {
            "hidden_size": 96,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "use_qkv_bias": True,
            "eos_token_id": None,
        },
    ),
    # OPT: learned positions (offset 2), ReLU, biases everywhere, tied head.
    "opt-96x4": ("opt", {"hidden_size": 96, "num_attention_heads": 4}),
    "opt-80x5-untied": ("opt", {"hidden_size": 80, "num_attention_heads": 5, "tie_word_embeddings": False}),
    "opt-96x4-proj64": ("opt", {"hidden_size": 96, "num_attention_heads": 4, "word_embed_proj_dim": 64}),
    "opt-112x4-postnorm": ("opt", {"hidden_size": 112, "num_attention_heads": 4, "do_layer_norm_before": False}),
}
#: One configuration per family in the default run: each failed on one of the targets before.
DEFAULT = ("gpt2-120x5", "gemma-96x4-d40-kv1", "phi3-96x4-kv2", "granite-96x4-kv2", "opt-96x4")


def decoder(name: str) -> Any:
    """The causal LM of ``CONFIGS[name]``, seeded: random weights, 2 layers, vocab 500."""
    return decoder_of(*CONFIGS[name])


def decoder_of(family: str, values: dict[str, Any]) -> Any:
    """A ``family`` causal LM with config ``values`` over the tests' defaults, seeded: random weights, 2 layers."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if family == "gpt2":
        config = tf.GPT2Config(**_COMMON, n_layer=2, n_positions=128, bos_token_id=0, eos_token_id=0, **values)
        return tf.GPT2LMHeadModel(config).eval()
    if family == "opt":
        values = {"ffn_dim": 160, "num_hidden_layers": 2, "max_position_embeddings": 128, **values}
        values.setdefault("word_embed_proj_dim", values["hidden_size"])
        return tf.OPTForCausalLM(tf.OPTConfig(**_COMMON, **values)).eval()
    if family == "granite":
        multipliers = {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0625}
        config = tf.GraniteConfig(**_COMMON, **_LLAMA_LIKE, **{**multipliers, "logits_scaling": 8.0, **values})
        return tf.GraniteForCausalLM(config).eval()
    if family == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(**_COMMON, **_LLAMA_LIKE, pad_token_id=0, **values)).eval()
    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "gpt_neox": (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM),
        "stablelm": (tf.StableLmConfig, tf.StableLmForCausalLM),
    }
    config_type, model_type = classes[family]
    return model_type(config_type(**_COMMON, **_LLAMA_LIKE, **values)).eval()


def _configs() -> list[Any]:
    return [name if name in DEFAULT else pytest.param(name, marks=pytest.mark.slow) for name in CONFIGS]


#: Each build exports three graphs (~15 s) and compiles them (onnxruntime ~10 s, tvm ~30 s) on 2 busy cores.
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", _configs())
def test_family_is_token_exact_against_transformers(name: str, target: str, tmp_path: Path) -> None:
    model = decoder(name)
    options = {"target_options": TVM_BUCKETS} if target == "tvm" else {}
    result = build_text_generation(model, tmp_path, target=target, name=name, **options)
    assert_build_token_exact(result, model)
    if target == "onnxruntime":  # GroupQueryAttention where ORT's kernel takes the head_dim, else the plain one
        _, head_dim = kv_shape(model)
        assert result.manifest.target.info["decode_attention"] == ("masked" if head_dim % 8 else "gqa")


def test_ort_attention_is_plain_where_group_query_attention_refuses_the_model() -> None:
    """ORT's GroupQueryAttention fails at run time on a head_dim off a multiple of 8, and the fused op has no
    soft-capping of the scores: such a model's onnxruntime build exports the plain attention, saying why."""
    import transformers as tf

    from aotforge.targets.onnxruntime.decoder import gqa_refusal

    assert gqa_refusal(tf.LlamaConfig(), 24) == "" and gqa_refusal(tf.LlamaConfig(), 48) == ""
    assert "head_dim 20 is not a multiple of 8" in gqa_refusal(tf.GraniteConfig(), 20)
    assert "soft-capped" in gqa_refusal(tf.Gemma2Config(attn_logit_softcapping=50.0), 32)


@pytest.mark.parametrize("target", TARGETS)
def test_sliding_window_shorter_than_the_cache_is_refused_before_the_export(target: str, tmp_path: Path) -> None:
    """The graphs' mask is ours: a window shorter than ``max_seq_len`` would go unapplied, so the build refuses
    it in one line naming the model's family and the target, before any export (a second at most)."""
    import torch
    import transformers as tf

    from aotforge.core.errors import UnsupportedModelError

    torch.manual_seed(0)
    config = tf.MistralConfig(**_COMMON, **_LLAMA_LIKE, hidden_size=64, num_attention_heads=4, sliding_window=16)
    with pytest.raises(
        UnsupportedModelError, match=rf"\(mistral\) cannot be built for {target}: .*sliding window of 16"
    ):
        build_text_generation(tf.MistralForCausalLM(config).eval(), tmp_path, target=target)
    assert not any(tmp_path.rglob("*.onnx"))


def _tied_lookup_plus_positions(rows: int, k: int, vocab: int) -> Any:
    """``main(ids [1, rows], pos [1, rows, k], e [vocab, k]) -> (take(e, ids) + pos) @ e^T``: GPT-2's and OPT's
    embedding, learned positions and tied head."""
    from tvm import relax

    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, rows), "int64"))
    pos = relax.Var("pos", relax.TensorType((1, rows, k), "float32"))
    e = relax.Var("e", relax.TensorType((vocab, k), "float32"))
    with bb.function("main", [ids, pos, e], attrs={"num_input": 2}):
        with bb.dataflow():
            h = bb.emit(relax.op.add(bb.emit(relax.op.take(e, ids, axis=0)), pos))
            y = bb.emit_output(relax.op.matmul(h, bb.emit(relax.op.permute_dims(e))))
        bb.emit_func_output(y)
    return bb.get()


def test_tvm_residual_rewrite_declines_an_embedding_lookup() -> None:
    """The tied head's embedding lookup becomes ``panel_rows(ids [rows], panels)``, a two-operand call over
    rank-1 ids: the residual rule adds a product into the panel kernel, and declines this one (it unpacked the
    ids' shape as ``[rows, k]`` first). The module still computes ``(e[ids] + pos) @ e^T``."""
    import tvm
    from tvm import relax

    from aotforge.targets.tvm.options import TvmOptions, target_dict
    from aotforge.targets.tvm.pipeline import compile_relax
    from aotforge.targets.tvm.rewrites.panel_weights import panel_matmuls

    rows, k, vocab = 3, 24, 40
    rng = np.random.default_rng(0)
    e = rng.standard_normal((vocab, k), dtype=np.float32)
    ids = rng.integers(0, vocab, (1, rows))
    pos = rng.standard_normal((1, rows, k), dtype=np.float32)
    mod, packed, report = panel_matmuls(_tied_lookup_plus_positions(rows, k, vocab), {"e": e}.__getitem__)
    assert report["lookups_from_panels"] == 1 and report["residuals_added_in_kernel"] == 0
    executable, _ = compile_relax(mod, tvm.target.Target(target_dict(TvmOptions())), fast_math=False)
    (name,) = packed
    vm = relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](*map(tvm.runtime.tensor, [ids, pos, packed[name]])).numpy()
    np.testing.assert_allclose(got, (e[ids] + pos) @ e.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("head_dim", "table", "fits"), [(32, 16, True), (64, 32, True), (24, 12, False), (40, 20, False), (32, 12, False)]
)
def test_ort_rotary_stays_out_of_attention_the_cpu_kernel_refuses(head_dim: int, table: int, fits: bool) -> None:
    """ORT's GroupQueryAttention takes cos / sin tables only at a head_dim that is a multiple of 16, of
    ``head_dim / 2`` or fewer columns and a multiple of 8; otherwise it fails at run time. The fusion checks it."""
    import onnx_ir as ir

    from aotforge.targets.onnxruntime.decoder_fusions import _cpu_rotary_fits

    heads = 4
    query = ir.Value(name="q", shape=ir.Shape([1, "seq", heads * head_dim]), type=ir.TensorType(ir.DataType.FLOAT))
    cos = ir.Value(name="cos", const_value=ir.tensor(np.zeros((64, table), dtype=np.float32)))
    node = ir.node("GroupQueryAttention", [query], attributes={"num_heads": heads}, domain="com.microsoft")
    assert _cpu_rotary_fits(node, query, cos) is fits


def test_logits_scaled_as_the_family_forward_scales_them() -> None:
    """Granite divides the head's output by ``logits_scaling``, Cohere multiplies by ``logit_scale``, Gemma 2
    soft-caps it; the export's head does the same (Granite's was lost: rel L2 1 on tvm). Llama does nothing."""
    import transformers as tf

    from aotforge.compiler.generative.graphs import head_scaling

    assert head_scaling(tf.GraniteConfig(logits_scaling=8.0)) == (8.0, 1.0, 0.0)
    assert head_scaling(tf.CohereConfig(logit_scale=0.25)) == (1.0, 0.25, 0.0)
    assert head_scaling(tf.Gemma2Config(final_logit_softcapping=30.0)) == (1.0, 1.0, 30.0)
    assert head_scaling(tf.LlamaConfig()) == (1.0, 1.0, 0.0)
