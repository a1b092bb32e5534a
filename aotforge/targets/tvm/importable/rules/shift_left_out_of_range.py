"""BitShift LEFT by a negative amount or by the width or more gives 0 (ONNX reads the amount unsigned;"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    attributes,
    constant,
    dtype,
)


class ShiftLeftOutOfRange(NodeRule):
    """BitShift LEFT by a negative amount or by the width or more gives 0 (ONNX reads the amount unsigned;
    LLVM's shl is undefined there)."""

    report_name, ops = "shift_left_out_of_range", ("BitShift",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if attr(node, "direction") != "LEFT" or dtype(node.inputs[1]) is None:
            return MatchResult().fail("not a left shift of a known type")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, y = node.inputs[0], node.inputs[1]
        kind = onnx.helper.tensor_dtype_to_np_dtype(dtype(y))  # type: ignore[arg-type]
        # y > width - 1: GreaterOrEqual is opset 12, BitShift opset 11
        width, zero = constant(op, np.array(8 * kind.itemsize - 1, kind)), constant(op, np.array(0, kind))
        out = op.Or(op.Greater(y, width), op.Less(y, zero))
        shifted = op.BitShift(x, op.Where(out, zero, y), **attributes(node))
        return op.Where(out, zero, shifted)
