"""Split with zero-size parts: those parts are empty constants, the others Slices (TVM's split needs"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    const,
    constant,
    input_,
    np_dtype,
    shape,
)


class SplitEmptyParts(NodeRule):
    """Split with zero-size parts: those parts are empty constants, the others Slices (TVM's split needs
    strictly rising indices)."""

    report_name, ops = "split_empty_parts", ("Split",)
    typed, shaped, constants = (0,), (0,), (1,)
    outputs = range(1, 65)

    def check_node(self, node: ir.Node) -> MatchResult:
        parts, given = const(input_(node, 1)), shape(node.inputs[0])
        if parts is None or given is None or not (parts == 0).any():
            return MatchResult().fail("no zero-size part")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        parts, given = const(node.inputs[1]), shape(x)
        assert parts is not None and given is not None  # checked
        axis = int(attr(node, "axis", 0)) % len(given)
        axes = constant(op, np.array([axis], np.int64))
        outputs, start = [], 0
        for size in (int(p) for p in parts):
            if size == 0:
                empty = np.zeros([0 if d == axis else n for d, n in enumerate(given)], np_dtype(x))
                outputs.append(constant(op, empty))
            else:
                begin, end = constant(op, np.array([start], np.int64)), constant(op, np.array([start + size], np.int64))
                outputs.append(op.Slice(x, begin, end, axes))
            start += size
        return outputs
