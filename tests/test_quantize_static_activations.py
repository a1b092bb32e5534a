"""int8 static: the activation type decides what ONNX Runtime's CPU optimizer fuses (issue 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from aotforge.core.errors import OptionsError
from aotforge.passes import make_pass
from aotforge.passes.manager import run_passes
from aotforge.passes.quantize_static import QuantizeStaticParams, QuantizeStaticPass
from tests.pass_models import INT8_REL_L2, feeds_for, rel_l2, run


def _residual_cnn() -> ir.Model:
    """x -> Conv -> Relu -> Conv -> Add(x) -> Relu -> Conv -> Add -> GAP -> MatMul: block inputs have two readers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["a2"], name="relu1"),
        helper.make_node("Conv", ["a2", "w2", "b2"], ["a3"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a3", "x"], ["a4"], name="add1"),
        helper.make_node("Relu", ["a4"], ["a5"], name="relu2"),
        helper.make_node("Conv", ["a5", "w3", "b3"], ["a6"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a6", "a5"], ["a7"], name="add2"),
        helper.make_node("GlobalAveragePool", ["a7"], ["a8"], name="gap"),
        helper.make_node("Flatten", ["a8"], ["a9"], name="flatten"),
        helper.make_node("MatMul", ["a9", "fc"], ["y"], name="fc"),
    ]
    inits = [weight(f"w{i}", (8, 8, 3, 3)) for i in (1, 2, 3)] + [weight(f"b{i}", (8,)) for i in (1, 2, 3)]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [*inits, weight("fc", (8, 10))],
    )
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    proto.ir_version = 8
    return ir.serde.deserialize_model(proto)


def _ort_optimized_ops(model: ir.Model, tmp_path: Path) -> dict[str, int]:
    """Op counts of the graph ONNX Runtime's CPU optimizer writes at the onnxruntime target's level (extended)."""
    import onnxruntime as ort

    ir.save(model, tmp_path / "q.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(str(tmp_path / "q.onnx"), opts, providers=["CPUExecutionProvider"])
    counts: dict[str, int] = {}
    for node in ir.load(tmp_path / "opt.onnx").graph:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_int8_static_uint8_activations_let_ort_fuse_every_conv_and_add(tmp_path: Path) -> None:
    model = _residual_cnn()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    pass_ = QuantizeStaticPass(QuantizeStaticParams(samples=8))
    pass_(model)
    assert pass_.stats["activations"] == "uint8" and pass_.stats["ops"]["Conv"] == 3
    ops = _ort_optimized_ops(model, tmp_path)
    assert ops.get("QLinearConv") == 3 and ops.get("QLinearAdd") == 2
    assert "Conv" not in ops and "Add" not in ops
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


def test_int8_static_int8_activations_leave_convs_with_a_shared_input_float(tmp_path: Path) -> None:
    # The cause of issue 3's 1.3-1.5x: with int8 activations ORT 1.32 keeps a Conv after a residual Add float.
    model = _residual_cnn()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    pass_ = make_pass("int8", {"activations": "INT8", "samples": "8"})
    run_passes(model, [pass_])
    assert pass_.stats["activations"] == "int8"
    ops = _ort_optimized_ops(model, tmp_path)
    assert ops.get("Conv", 0) >= 1 and ops.get("QLinearConv", 0) >= 1
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


def test_int8_static_rejects_unknown_activations() -> None:
    with pytest.raises(OptionsError, match="activations 'int4' is unknown; use uint8, int8"):
        make_pass("int8", {"activations": "int4"})
