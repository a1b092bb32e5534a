"""ReduceMax / ReduceMin of bools through uint8 (TVM has no min/max value for bool)."""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    dtype,
    through_dtype,
)


class ReduceBool(NodeRule):
    """ReduceMax / ReduceMin of bools through uint8 (TVM has no min/max value for bool)."""

    report_name, ops = "reduce_bool", ("ReduceMax", "ReduceMin")

    def check_node(self, node: ir.Node) -> MatchResult:
        if dtype(node.inputs[0]) != onnx.TensorProto.BOOL:
            return MatchResult().fail("not bool")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return through_dtype(op, node, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL)
