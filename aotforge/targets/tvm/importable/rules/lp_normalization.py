"""LpNormalization as x / ReduceL1|L2(x, axis, keepdims) (not in the importer)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    constant,
    np_dtype,
    shape,
)


class LpNormalization(NodeRule):
    """LpNormalization as x / ReduceL1|L2(x, axis, keepdims) (not in the importer)."""

    report_name, ops = "lp_normalization", ("LpNormalization",)
    typed, shaped = (0,), (0,)

    def check_node(self, node: ir.Node) -> MatchResult:
        if int(attr(node, "p", 2)) not in (1, 2):
            return MatchResult().fail("p other than 1 or 2")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        axis, p, rank = int(attr(node, "axis", -1)), int(attr(node, "p", 2)), len(shape(x))  # type: ignore[arg-type]
        kind = np_dtype(x)
        norm = self.axes_op(op, f"ReduceL{p}", [x], [axis % rank], keepdims=1)
        # a zero vector stays zero, as ONNX Runtime gives
        safe = op.Where(op.Equal(norm, constant(op, np.array(0, kind))), constant(op, np.array(1, kind)), norm)
        return op.Div(x, safe)
