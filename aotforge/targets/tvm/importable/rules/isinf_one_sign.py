"""IsInf with one of detect_positive / detect_negative off is an Equal to that infinity (TVM ignores both)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    constant,
    dtype,
    shape,
)


class IsInfOneSign(NodeRule):
    """IsInf with one of detect_positive / detect_negative off is an Equal to that infinity (TVM ignores both)."""

    report_name, ops = "isinf_one_sign", ("IsInf",)
    typed = (0,)

    def check_node(self, node: ir.Node) -> MatchResult:
        if attr(node, "detect_positive", 1) and attr(node, "detect_negative", 1):
            return MatchResult().fail("both signs detected: TVM's own")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        positive, negative = attr(node, "detect_positive", 1), attr(node, "detect_negative", 1)
        if not positive and not negative:
            return constant(op, np.zeros(shape(x) or (), bool))
        inf = np.array(np.inf if positive else -np.inf, onnx.helper.tensor_dtype_to_np_dtype(dtype(x)))  # type: ignore[arg-type]
        return op.Equal(x, constant(op, inf))
