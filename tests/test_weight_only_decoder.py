"""Weight-only int4 / int8 on decoders (onnxruntime): the LM head (a Gemm, tied or untied) is taken, the
manifest names what was taken and why not the rest; quality gates on the trained pair are slow tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotforge.passes import make_pass
from aotforge.passes.manager import run_passes
from aotforge.passes.ort_quantization import op_counts
from tests.llm_models import tiny_causal_lm
from tests.lm_bytes import encode
from tests.lm_pair import LmPair, torch_perplexity
from tests.pass_models import _finish, run
from tests.quality_gates import GATE_TOKENS, assert_within_gates, build_trained_target, quality_report

VOCAB, HIDDEN = 96, 64


def tied_lm(bias: bool = False) -> ir.Model:
    """ids -> Gather(embed) -> Gemm(h, embed, transB=1) -> logits: the shape of a tied LM head."""
    rng = np.random.default_rng(0)
    embed = numpy_helper.from_array((rng.standard_normal((VOCAB, HIDDEN)) * 0.3).astype(np.float32), "embed")
    inits = [embed]
    gemm_inputs = ["h", "embed"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(VOCAB).astype(np.float32), "head_bias"))
        gemm_inputs.append("head_bias")
    nodes = [
        helper.make_node("Gather", ["embed", "ids"], ["h"], name="embedding"),
        helper.make_node("Gemm", gemm_inputs, ["logits"], name="lm_head", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [5, VOCAB])],
        inits,
    )
    return _finish(graph)


def _producer(model: ir.Model, output: str) -> ir.Node:
    value = next(v for v in model.graph.outputs if v.name == output)
    node = value.producer()
    assert node is not None
    return node


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("bits", "block", "tolerance"), [(4, 32, 0.15), (8, 64, 0.01)])
def test_tied_head_is_taken_and_the_embedding_stays_float(bits: int, block: int, tolerance: float, bias: bool) -> None:
    model = tied_lm(bias)
    feeds = {"ids": np.array([0, 5, 17, 42, 95], dtype=np.int64)}
    expected = run(model, feeds)[0]
    (record,) = run_passes(model, [make_pass("weight-only", {"bits": str(bits), "block_size": str(block)})])
    assert record.stats["taken"] == ["lm_head"] and record.stats["not_taken"] == {}
    head = _producer(model, "logits")
    assert head.op_type == ("Add" if bias else "MatMulNBits")
    gather = next(n for n in model.graph if n.op_type == "Gather")
    assert gather.inputs[0] is not None and gather.inputs[0].name == "embed"  # the tied embedding is still fp32
    assert op_counts(model) == {"MatMulNBits": 1}
    got = run(model, feeds)[0]
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < tolerance


def tied_lm_3d() -> ir.Model:
    """ids [1, 5] -> Gather(embed) -> MatMul(h, Transpose(embed)) -> logits [1, 5, vocab]: how the exporter writes a
    tied head over every position (a verify graph's), the weight a Transpose of the embedding."""
    rng = np.random.default_rng(0)
    embed = numpy_helper.from_array((rng.standard_normal((VOCAB, HIDDEN)) * 0.3).astype(np.float32), "embed")
    nodes = [
        helper.make_node("Gather", ["embed", "ids"], ["h"], name="embedding"),
        helper.make_node("Transpose", ["embed"], ["embed_t"], name="head_transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "embed_t"], ["logits"], name="lm_head"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied3d",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5, VOCAB])],
        [embed],
    )
    return _finish(graph)


def test_a_head_over_a_transposed_embedding_is_taken_as_the_2d_head_is() -> None:
    """The 3-D tied head quantizes to the same MatMulNBits (same weight bytes, same logits) as the 2-D Gemm head, so
    a verify graph's logits are those of the decode graph's, not a float head's."""
    ids = np.array([0, 5, 17, 42, 95], dtype=np.int64)
    flat, deep = tied_lm(), tied_lm_3d()
    (flat_record,) = run_passes(flat, [make_pass("weight-only", {"head_bits": "8"})])
    (deep_record,) = run_passes(deep, [make_pass("weight-only", {"head_bits": "8"})])
    assert deep_record.stats["taken"] == ["lm_head"] and deep_record.stats["head"] == ["lm_head"]
    assert op_counts(deep) == {"MatMulNBits": 1} and not any(n.op_type == "Transpose" for n in deep.graph)
    packed = [_producer(m, "logits").inputs[1] for m in (flat, deep)]
    assert np.array_equal(*(v.const_value.numpy() for v in packed if v is not None and v.const_value is not None))
    np.testing.assert_array_equal(run(deep, {"ids": ids[None]})[0][0], run(flat, {"ids": ids})[0])


def test_a_gemm_it_cannot_take_is_reported_with_its_reason() -> None:
    model = tied_lm()
    head = next(n for n in model.graph if n.op_type == "Gemm")
    head.attributes["alpha"] = ir.AttrFloat32("alpha", 0.5)
    (record,) = run_passes(model, [make_pass("weight-only")])
    assert record.stats["skipped"] == "no MatMul or Gemm with a constant 2-D weight"
    assert op_counts(model) == {} and head.op_type == "Gemm"


@pytest.mark.parametrize("target", ["onnxruntime", "tvm"])
def test_text_generation_builds_default_to_int8_activations(target: str) -> None:
    """A text-generation build's weight-only pass computes with int8 activations (``accuracy_level`` 4) unless the
    user sets the level; an encoder's build keeps ONNX Runtime's own (0)."""
    from aotforge.compiler.builder import target_passes
    from aotforge.compiler.generative.graph_passes import compile_passes, graph_passes_of
    from aotforge.compiler.options import BuildOptions
    from aotforge.targets import get_target
    from aotforge.targets.generative import generative_backend

    backend, tgt = generative_backend(target), get_target(target)

    def level(params: dict[str, Any]) -> int:
        opts = BuildOptions.from_dict(
            {"target": target, "passes": ("weight-only",), "pass_params": {"weight-only": params}}
        )
        factory = graph_passes_of(opts, tgt, backend)
        (weight_only,) = factory() if factory is not None else compile_passes(opts, tgt, backend).values()
        weight_only = getattr(weight_only, "params", weight_only)
        return int(weight_only.accuracy_level)

    assert level({"bits": 4}) == 4
    assert level({"bits": 8, "accuracy_level": 0}) == 0
    encoder = BuildOptions.from_dict({"target": "onnxruntime", "passes": ("weight-only",)})
    assert target_passes(encoder, get_target("onnxruntime"))[1][0].params.accuracy_level == 0


#: One export (~25 s on 2 busy cores) runs by default: the tied head, the case that needs the transposed copy.
@pytest.fixture(scope="module", params=["llama-tied", pytest.param("llama", marks=pytest.mark.slow)])
def decoder_graphs(request: pytest.FixtureRequest) -> tuple[str, ir.Model, ir.Model]:
    from aotforge.compiler.generative.export import decoder_spec, export_graphs

    model = tiny_causal_lm(request.param)
    prefill, decode = export_graphs(model, decoder_spec(model, 32, 1), "tiny", decode_attention="gqa")
    return str(request.param), prefill, decode


def test_both_decoder_graphs_take_every_linear_and_the_head(decoder_graphs: tuple[str, ir.Model, ir.Model]) -> None:
    """Every projection and the LM head of the exported graphs becomes MatMulNBits; anything left is named with its
    reason (the onnxruntime graphs' attention is GroupQueryAttention in prefill too: no activation x activation
    MatMul is left)."""
    arch, prefill, decode = decoder_graphs
    for name, graph in (("prefill", prefill), ("decode", decode)):
        graph = ir.from_proto(ir.to_proto(graph))  # a copy: the fixture serves both checks
        head = _producer(graph, "logits")
        (record,) = run_passes(graph, [make_pass("weight-only", {"block_size": "32"})])
        stats = record.stats
        assert str(head.name) in stats["taken"], (arch, name)
        assert _producer(graph, "logits").op_type == "MatMulNBits"
        # 2 layers x (q, k, v, o, gate, up, down) + the head
        assert stats["nodes_quantized"] == len(stats["taken"]) == 2 * 7 + 1, (arch, name, stats)
        assert set(stats["not_taken"].values()) <= {"weight computed at run time (activation x activation)"}


@pytest.mark.slow  # four onnxruntime builds of the trained target (~1 min each on a quiet 2-core machine)
def test_quality_gates_on_the_trained_target(lm_pair: LmPair, tmp_path: Path) -> None:
    """Held-out perplexity through the artifacts (``tests/quality_gates.py``): int8 <= +2% and int4 g32 / g64 <= +8%
    of fp32, which equals torch's; greedy agreement with the fp32 artifact reported; every projection and the head
    taken."""
    import transformers

    def check(name: str, result: Any) -> None:
        for entry in [p for p in result.manifest.passes if p["name"] == "weight-only"]:
            # 4 layers x (qkv, o, gate+up, down: decoder_fusions packs q/k/v and gate/up) + the head
            assert entry["stats"]["nodes_quantized"] == 4 * 4 + 1, (name, entry)

    report = quality_report(
        lm_pair, lambda name, params: build_trained_target(lm_pair, tmp_path / name, "onnxruntime", params), check
    )
    print(json.dumps(report, indent=1))  # noqa: T201  (the figures the closing note quotes; run with -s)
    model = transformers.LlamaForCausalLM.from_pretrained(lm_pair.target_dir).eval()
    tokens = encode(lm_pair.heldout_text)[:GATE_TOKENS]
    assert report["fp32"]["perplexity"] == pytest.approx(torch_perplexity(model, tokens), rel=1e-3)
    assert_within_gates(report)


def test_head_bits_keeps_the_head_at_8_bits_and_the_rest_at_4(decoder_graphs: tuple[str, ir.Model, ir.Model]) -> None:
    """``head_bits=8``: the LM head (the MatMul producing ``logits``) at 8 bits, every other projection at 4."""
    arch, _, decode = decoder_graphs
    graph = ir.from_proto(ir.to_proto(decode))
    (record,) = run_passes(graph, [make_pass("weight-only", {"head_bits": "8"})])
    head = _producer(graph, "logits")
    assert head.op_type == "MatMulNBits" and head.attributes.get_int("bits") == 8, arch
    bits = [n.attributes.get_int("bits") for n in graph.graph if n.op_type == "MatMulNBits" and n is not head]
    assert bits == [4] * (2 * 7), arch
    assert record.stats["nodes_quantized"] == 2 * 7 + 1 and record.stats["head_bits"] == 8
    assert record.stats["head"] == [_source(head)]


def test_head_bits_equal_to_bits_changes_nothing() -> None:
    model, plain = tied_lm(), tied_lm()
    (record,) = run_passes(model, [make_pass("weight-only", {"bits": "8", "head_bits": "8"})])
    run_passes(plain, [make_pass("weight-only", {"bits": "8"})])
    assert "head" not in record.stats
    assert ir.to_proto(model).graph == ir.to_proto(plain).graph


def _source(node: ir.Node) -> str:
    return str(node.name).removesuffix("_Q8")
