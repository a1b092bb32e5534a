"""QLinearMatMul as int32 MatMul of the zero-point-shifted inputs, requantized in float64."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import MatchResult, NodeRule, constant, dtype, np_dtype, shape


class QLinearMatMul(NodeRule):
    """QLinearMatMul as int32 MatMul of the zero-point-shifted inputs, requantized in float64.

    As onnx's reference (and ONNX Runtime, which passes its cases) computes it: the scale
    ``a_scale * b_scale / y_scale`` in the scales' type, the int32 product times it plus the output
    zero point in float64, rounded half to even, clipped to the output type. Per-tensor scales and
    zero points only (a per-row or per-column one is left alone, and refused at planning).
    """

    report_name, ops = "qlinear_matmul", ("QLinearMatMul",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if len(node.inputs) != 8 or any(v is None for v in node.inputs):
            return MatchResult().fail("an input left out")
        scales = [*node.inputs[1:3], *node.inputs[4:]]
        if any((s := shape(v)) is None or int(np.prod(s)) != 1 for v in scales):
            return MatchResult().fail("a scale or zero point not per tensor")
        return MatchResult() if dtype(node.inputs[7]) is not None else MatchResult().fail("output type unknown")

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = node.inputs
        info = np.iinfo(np_dtype(y_zero))  # type: ignore[arg-type]
        int32, double = onnx.TensorProto.INT32, onnx.TensorProto.DOUBLE
        a0 = op.Sub(op.Cast(a, to=int32), op.Cast(a_zero, to=int32))
        b0 = op.Sub(op.Cast(b, to=int32), op.Cast(b_zero, to=int32))
        c = op.Cast(op.MatMul(a0, b0), to=double)
        scale = op.Cast(op.Div(op.Mul(a_scale, b_scale), y_scale), to=double)
        r = op.Round(op.Add(op.Mul(c, scale), op.Cast(y_zero, to=double)))
        low, high = constant(op, np.array(info.min, np.float64)), constant(op, np.array(info.max, np.float64))
        return op.Cast(op.Clip(r, low, high), to=dtype(y_zero))
