"""Rewrites of quantized ops the importer lacks into integer and float primitives it imports."""

from __future__ import annotations

import numpy as np
import onnx

from aotforge.targets.tvm.importable.rules.base import Graph, make


def qlinear_matmul(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """QLinearMatMul as int32 MatMul of the zero-point-shifted inputs, requantized in float64.

    As onnx's reference (and ONNX Runtime, which passes its cases) computes it: the scale
    ``a_scale * b_scale / y_scale`` in the scales' type, the int32 product times it plus the output
    zero point in float64, rounded half to even, clipped to the output type. Per-tensor scales and
    zero points only (a per-row or per-column one is left alone, and refused at planning).
    """
    if node.op_type != "QLinearMatMul" or len(node.input) != 8 or not all(node.input):
        return None
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = node.input
    if any(g.shapes.get(v) is None or int(np.prod(g.shapes[v])) != 1 for v in (*node.input[1:3], *node.input[4:])):
        return None
    if y_zero not in g.dtypes:
        return None
    out = node.output[0]
    info = np.iinfo(g.np_dtype(y_zero))
    low, low_node = g.constant("qmatmul_min", np.array(info.min, np.float64))
    high, high_node = g.constant("qmatmul_max", np.array(info.max, np.float64))
    int32, double = onnx.TensorProto.INT32, onnx.TensorProto.DOUBLE
    a32, az32, b32, bz32, a0, b0, c, c64, scale_ab, scale, scale64, y0, y0_64, d, dz, r, clipped = (
        g.fresh(f"{out}_{k}")
        for k in ("a32", "az32", "b32", "bz32", "a0", "b0", "c", "c64", "sab", "s", "s64", "y0", "y064", "d", "dz")
        + ("r", "clip")
    )
    return [
        low_node, high_node,
        make("Cast", [a], [a32], to=int32),
        make("Cast", [a_zero], [az32], to=int32),
        make("Sub", [a32, az32], [a0]),
        make("Cast", [b], [b32], to=int32),
        make("Cast", [b_zero], [bz32], to=int32),
        make("Sub", [b32, bz32], [b0]),
        make("MatMul", [a0, b0], [c]),
        make("Cast", [c], [c64], to=double),
        make("Mul", [a_scale, b_scale], [scale_ab]),
        make("Div", [scale_ab, y_scale], [scale]),
        make("Cast", [scale], [scale64], to=double),
        make("Mul", [c64, scale64], [d]),
        make("Cast", [y_zero], [y0_64], to=double),
        make("Add", [d, y0_64], [dz]),
        make("Round", [dz], [r]),
        make("Clip", [r, low, high], [clipped]),
        make("Cast", [clipped], [out], to=g.dtypes[y_zero]),
    ]  # fmt: skip
