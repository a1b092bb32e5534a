"""Float ReduceMax / ReduceMin whose every value is -inf / +inf (or none, an empty set) gives that infinity."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    FLOATS,
    MatchResult,
    NodeRule,
    attributes,
    constant,
    dtype,
    np_dtype,
)


class ReduceExtremeInfinity(NodeRule):
    """Float ReduceMax / ReduceMin whose every value is -inf / +inf (or none, an empty set) gives that infinity.

    TVM starts a max reduction at the lowest finite value (a min at the highest), so a row of -inf
    (an attention row fully masked) came out as -3.4e38. Where the result is that value and no
    element equals it, the answer is the infinity: a second reduction of ``x == lowest`` says which.
    """

    report_name, ops = "reduce_extreme_infinity", ("ReduceMax", "ReduceMin")

    def check_node(self, node: ir.Node) -> MatchResult:
        return MatchResult() if dtype(node.inputs[0]) in FLOATS else MatchResult().fail("not float")

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        kind, is_max = np_dtype(x), node.op_type == "ReduceMax"
        if dtype(x) == onnx.TensorProto.BFLOAT16:
            import ml_dtypes

            info: Any = ml_dtypes.finfo(kind)
        else:
            info = np.finfo(kind)
        edge = constant(op, np.array(info.min if is_max else info.max, kind))
        infinity = constant(op, np.array(-np.inf if is_max else np.inf, kind))
        reduced = getattr(op, node.op_type)(*node.inputs, **attributes(node))
        hits = op.Cast(op.Equal(x, edge), to=onnx.TensorProto.UINT8)
        has = op.ReduceMax(hits, *node.inputs[1:], **attributes(node))  # any element at the edge
        none = op.Equal(has, constant(op, np.array(0, np.uint8)))
        return op.Where(op.And(op.Equal(reduced, edge), none), infinity, reduced)
