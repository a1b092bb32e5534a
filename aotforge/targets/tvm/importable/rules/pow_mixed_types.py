"""Pow with an exponent of another type (TVM wants one), or of integers (TVM's power is float only)."""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    FLOATS,
    MatchResult,
    NodeRule,
    dtype,
)

DOUBLE = onnx.TensorProto.DOUBLE


class PowMixedTypes(NodeRule):
    """Pow with an exponent of another type (TVM wants one), or of integers (TVM's power is float only)."""

    report_name, ops = "pow_mixed_types", ("Pow",)
    typed = (0, 1)

    def check_node(self, node: ir.Node) -> MatchResult:
        base, exponent = dtype(node.inputs[0]), dtype(node.inputs[1])
        if base in FLOATS and exponent == base:
            return MatchResult().fail("float base and exponent of one type: TVM's own")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, y = node.inputs[0], node.inputs[1]
        base = dtype(x)
        if base in FLOATS:
            return op.Pow(x, op.Cast(y, to=base))
        # integers: exact through float64 up to 2**53
        return op.Cast(op.Pow(op.Cast(x, to=DOUBLE), op.Cast(y, to=DOUBLE)), to=base)
