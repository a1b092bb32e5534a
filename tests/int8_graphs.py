"""Integer ONNX graphs as the int8 passes leave them, for the tvm integer rewrites' tests, and the host they run on.

``int8-dynamic`` leaves ``MatMulInteger``; static ``int8`` leaves convolutions between DequantizeLinear
and QuantizeLinear (QDQ). ``needs_vnni`` skips what must run the VNNI kernels on a CPU without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm.target.codegen import target_has_features

from aotforge.targets.tvm.options import TvmOptions, target_dict


def host_target() -> Any:
    return tvm.target.Target(target_dict(TvmOptions()))


needs_vnni = pytest.mark.skipif(
    not target_has_features("avx512vnni", host_target()), reason="this CPU has no AVX-512 VNNI to run the kernel on"
)


def matmul_integer_graph(
    *, a_type: int = TensorProto.UINT8, weight_zero: int = 0, weight_const: bool = True, rows: int = 4
) -> Any:
    """``MatMulInteger(a, w, za, wz)`` as ``int8-dynamic`` emits it (the ONNX graph)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(-128, 128, (64, 32), dtype=np.int8), "w")
    zeros = [
        numpy_helper.from_array(np.array(7, np.uint8 if a_type == TensorProto.UINT8 else np.int8), "za"),
        numpy_helper.from_array(np.array(weight_zero, np.int8), "wz"),
    ]
    inputs = [helper.make_tensor_value_info("a", a_type, [rows, 64])]
    if not weight_const:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.INT8, [64, 32]))
    return helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "za", "wz"], ["y"])],
        "matmul_integer",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.INT32, [rows, 32])],
        zeros + ([w] if weight_const else []),
    )


def matmul_integer(**graph: Any) -> Any:
    """``_matmul_integer_graph`` through the Relax ONNX importer."""
    from tvm.relax.frontend.onnx import from_onnx

    model = helper.make_model(matmul_integer_graph(**graph), opset_imports=[helper.make_opsetid("", 17)])
    return from_onnx(model, keep_params_in_input=False)


def qdq_conv(out_channels: int, group: int, in_channels: int = 8) -> Any:
    """``Conv(DequantizeLinear(x_u8), DequantizeLinear(w_s8))`` as static ``int8`` leaves it, imported."""
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array(
            rng.integers(-127, 128, (out_channels, in_channels // group, 3, 3), dtype=np.int8), "w"
        ),
        numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
        numpy_helper.from_array(np.array(9, np.uint8), "zx"),
        numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
        numpy_helper.from_array(np.array(0, np.int8), "zw"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
        helper.make_node("Conv", ["xf", "wf"], ["y"], pads=[1, 1, 1, 1], group=group),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, in_channels, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, 6, 6])],
        inits,
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), keep_params_in_input=False)


def qdq_chain(
    path: Path, *, bias: bool = False, activations: tuple[str, str, str] = ("", "", ""), second_reader: bool = False
) -> Path:
    """QDQ stem 3x3 (16) -> depthwise 3x3 -> pointwise 1x1 (32) -> + residual-free mean: quantized the
    way static ``int8`` leaves a CNN (every Conv between DequantizeLinear and QuantizeLinear).

    ``bias``: each Conv has a float bias; ``activations``: ``Clip`` (0, 6), ``Relu`` or nothing after
    each Conv, as a quantizer that did not absorb them leaves them; ``second_reader``: the stem's
    float output is also read by the graph's output (a mean of it added)."""
    rng = np.random.default_rng(5)
    inits, nodes, x = [], [], "x"
    for i, (cout, cin, k, group) in enumerate([(16, 3, 3, 1), (16, 1, 3, 16), (32, 16, 1, 1)]):
        inits += [
            numpy_helper.from_array(rng.integers(-127, 128, (cout, cin, k, k), dtype=np.int8), f"w{i}"),
            numpy_helper.from_array(rng.uniform(0.001, 0.003, cout).astype(np.float32), f"sw{i}"),
            numpy_helper.from_array(np.zeros(cout, np.int8), f"zw{i}"),
            numpy_helper.from_array(np.array(0.05, np.float32), f"s{i}"),
            numpy_helper.from_array(np.array(100 + i, np.uint8), f"z{i}"),
        ]
        if bias:
            inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, cout).astype(np.float32), f"b{i}"))
        nodes += [
            helper.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
            helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
            helper.make_node("DequantizeLinear", [f"w{i}", f"sw{i}", f"zw{i}"], [f"wf{i}"], axis=0),
            helper.make_node(
                "Conv", [f"d{i}", f"wf{i}", *([f"b{i}"] if bias else [])], [f"c{i}"], pads=[k // 2] * 4, group=group
            ),
        ]
        x = f"c{i}"
        if activations[i]:
            bounds = ["lo", "hi"] if activations[i] == "Clip" else []
            nodes.append(helper.make_node(activations[i], [x, *bounds], [f"a{i}"]))
            x = f"a{i}"
    if "Clip" in activations:
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    nodes.append(helper.make_node("ReduceMean", [x], ["m" if second_reader else "y"], axes=[2, 3], keepdims=0))
    if second_reader:
        nodes.append(helper.make_node("ReduceMean", ["c0"], ["m0"], axes=[1, 2, 3], keepdims=0))
        nodes.append(helper.make_node("Add", ["m", "m0"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "qdq_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
