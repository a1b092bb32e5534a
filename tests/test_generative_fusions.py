"""The fused attention of text-generation graphs: the GroupQueryAttention prefill / decode modules equal the
masked graphs in torch, and the onnxruntime graphs (``llama_ort``, tests/conftest.py) run ORT's contrib ops."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from tests.llm_models import ARCHITECTURES, PROMPTS, tiny_causal_lm


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_decode_matches_the_masked_graph(arch: str) -> None:
    """The GroupQueryAttention decode (eager reference of aotforge::slot_gqa) equals the masked graph: same
    logits, the same cache at every filled position, two slots at different positions."""
    import torch

    from aotforge.compiler.generative.export import decoder_spec
    from aotforge.compiler.generative.graphs import Decode

    model = tiny_causal_lm(arch)
    spec = decoder_spec(model, 32, 2)
    torch.manual_seed(1)
    cache = [torch.randn(2, spec.kv_heads, 32, spec.head_dim) for _ in range(2 * spec.layers)]
    write_pos, ids = torch.tensor([5, 9]), torch.tensor([[3], [7]])
    with torch.no_grad():
        masked = Decode(model)(ids, write_pos[:, None], write_pos, *cache)
        fused = Decode(model, fused_attention=True)(ids, write_pos[:, None], write_pos, *cache)
    torch.testing.assert_close(fused[0], masked[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(fused[1:], masked[1:], strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_prefill_matches_the_masked_graph(arch: str) -> None:
    """The GroupQueryAttention prefill (eager reference of aotforge::prompt_gqa) equals the masked graph on two
    right-padded prompts: the same last-token logits, the same keys/values at every real position."""
    import torch

    from aotforge.compiler.generative.graphs import Prefill

    model = tiny_causal_lm(arch)
    ids = torch.tensor([PROMPTS[0][:6], PROMPTS[0][2:6] + [0, 0]])
    mask = torch.tensor([[1] * 6, [1] * 4 + [0, 0]])
    pos = torch.arange(6).repeat(2, 1)
    with torch.no_grad():
        masked = Prefill(model)(ids, mask, pos)
        fused = Prefill(model, fused_attention=True)(ids, mask, pos)
    torch.testing.assert_close(fused[0], masked[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(fused[1:], masked[1:], strict=True):
        torch.testing.assert_close(a[0], b[0])
        torch.testing.assert_close(a[1, :, :4], b[1, :, :4])


def test_onnxruntime_decode_runs_group_query_attention(llama_ort: Any) -> None:
    import onnx

    decode = onnx.load(llama_ort.path / "decode.onnx", load_external_data=False)
    ops = {(n.domain, n.op_type) for n in decode.graph.node}
    assert ("com.microsoft", "GroupQueryAttention") in ops and ("", "ScatterElements") not in ops
    assert llama_ort.manifest.target.info["decode_attention"] == "gqa"


def test_onnxruntime_graphs_run_fused_contrib_ops(llama_ort: Any) -> None:
    """The onnxruntime graphs run ORT's contrib ops (the token-exact tests above run these graphs): RMSNorm and
    residual + RMSNorm fused, q / k / v and gate / up each one MatMul over weights stored side by side (the same
    bytes in both graphs: stored once), attention one GroupQueryAttention per layer (over the prompt in prefill,
    no past), rotary inside it (do_rotary, packed QKV, the graph's position_ids), its output into o_proj with no
    Reshape; no standard-op spelling is left.
    """
    import onnx

    layers = tiny_causal_lm("llama").config.num_hidden_layers
    for graph in ("prefill", "decode"):
        model = onnx.load(llama_ort.path / f"{graph}.onnx", load_external_data=False)
        ops = collections.Counter(n.op_type for n in model.graph.node)
        assert ops["GroupQueryAttention"] == layers and ops["SkipSimplifiedLayerNormalization"] == 2 * layers
        assert ops["SimplifiedLayerNormalization"] == 1
        unfused = {"Pow", "Sqrt", "Reciprocal", "Neg", "Cos", "Sin", "Softmax", "RotaryEmbedding"} & set(ops)
        assert not unfused, sorted(ops.items())
        fused = llama_ort.manifest.target.info["fusions"][graph]
        assert fused == {
            "packed_matmuls": 5 * layers,
            "rotary_embedding": 2 * layers,
            "rms_normalization": 2 * layers + 1,
            "skip_rms_normalization": 2 * layers,
            "rotary_in_attention": layers,
            "rotary_in_attention_declined": 0,
            "packed_qkv_attention": layers,
            "identity_reshapes": layers,
        }
        assert ops["Reshape"] == (1 if graph == "prefill" else 0)  # prefill: the last token's index
        for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
            assert node.input[1:3] == ["", ""] and node.input[9] == "position_ids"
            past = node.input[3:5]
            assert past == ["", ""] if graph == "prefill" else past[0].startswith("past_key_"), past
            assert {a.name: a.i for a in node.attribute}["do_rotary"] == 1
            assert next(n.op_type for n in model.graph.node if node.input[0] in n.output) == "MatMul"
