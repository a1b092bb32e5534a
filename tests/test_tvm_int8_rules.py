"""The tvm integer rewrites on imported graphs: MatMulInteger and QDQ convolutions -> the integer kernels,
or the reason why not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm.target.codegen import target_has_features

from tests.int8_graphs import host_target, matmul_integer, matmul_integer_graph, qdq_conv


def test_a_ragged_row_count_is_padded_to_whole_row_tiles() -> None:
    """37 rows (ViT's tokens) have no row tile but 1: the kernel runs on 40 rows and the 3 extra go."""
    from tvm import relax

    from aotforge.targets.tvm.relax_util import any_call, op_name
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    mod, report = rewrite_integer_ops(matmul_integer(rows=37))
    assert report is not None and report["by_op"] == {"matmul": 1}
    assert "vnni_dense_40x64x32" in [gv.name_hint for gv in mod.get_global_vars()]
    assert any_call(mod, lambda e: op_name(e) == "relax.strided_slice")
    if target_has_features("avx512vnni", host_target()):
        a = np.random.default_rng(7).integers(0, 256, (37, 64), dtype=np.uint8)
        vm = relax.VirtualMachine(tvm.compile(mod, target=host_target()), tvm.cpu())
        w = [numpy_helper.to_array(t) for t in matmul_integer_graph(rows=37).initializer if t.name == "w"][0]
        expected = (a.astype(np.int64) - 7) @ w.astype(np.int64)
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), expected)


def test_matmuls_reading_one_activation_pad_it_once() -> None:
    """Q, K and V read one quantized activation: its row padding is emitted once, not per matmul."""
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.targets.tvm.relax_util import relax_functions
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    graph = matmul_integer_graph(rows=37)
    graph.node.append(helper.make_node("MatMulInteger", ["a", "w", "za", "wz"], ["y2"]))
    graph.output.append(helper.make_tensor_value_info("y2", TensorProto.INT32, [37, 32]))
    mod = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), keep_params_in_input=False)
    mod, report = rewrite_integer_ops(mod)
    assert report is not None and report["by_op"] == {"matmul": 2}
    (_, main), *_ = relax_functions(mod)
    assert main.script().count("R.nn.pad(") == 1


@pytest.mark.parametrize(
    ("graph", "skipped"),
    [
        ({}, {}),
        ({"a_type": TensorProto.INT8}, {"activation is not uint8": 1}),
        ({"weight_zero": 3}, {"weight zero point is not a constant zero": 1}),
        ({"weight_const": False}, {"weight is not a constant": 1}),
    ],
)
def test_integer_matmul_rule_rewrites_or_reports_why_not(graph: dict[str, Any], skipped: dict[str, int]) -> None:
    from aotforge.targets.tvm.rewrites.int8 import count_integer_ops, rewrite_integer_ops

    mod = matmul_integer(**graph)
    assert count_integer_ops(mod) == 1
    _, report = rewrite_integer_ops(mod)
    assert report is not None and report["skipped"] == skipped
    assert report["by_op"] == ({} if skipped else {"matmul": 1}) and report["kernels"] == (0 if skipped else 1)


@pytest.mark.parametrize(
    ("out_channels", "group", "in_channels", "applied", "skipped"),
    [
        (16, 1, 8, "conv2d", {}),
        (16, 16, 16, "depthwise_conv2d", {}),
        (16, 2, 8, "", {"grouped convolution with 4 channels per group (only depthwise is supported)": 1}),
        (8, 1, 8, "", {"8 output channels are not a multiple of 16": 1}),
        (8, 8, 8, "", {"depthwise convolution's 8 channels are not a multiple of 16": 1}),
        (32, 16, 16, "", {"depthwise channel multiplier 2 (only 1 is supported)": 1}),
    ],
)
def test_qdq_conv_rule_rewrites_or_reports_why_not(
    out_channels: int, group: int, in_channels: int, applied: str, skipped: dict[str, int]
) -> None:
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    _, report = rewrite_integer_ops(qdq_conv(out_channels, group, in_channels))
    assert report is not None and report["skipped"] == skipped
    assert report["by_op"] == ({applied: 1} if applied else {})
