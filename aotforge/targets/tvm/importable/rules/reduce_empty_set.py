"""ReduceMax / ReduceMin over a static axis of size 0: a constant of the type's lowest / highest value"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    FLOATS,
    MatchResult,
    NodeRule,
    attr,
    const,
    constant,
    dtype,
    input_,
    np_dtype,
    shape,
)


class ReduceEmptySet(NodeRule):
    """ReduceMax / ReduceMin over a static axis of size 0: a constant of the type's lowest / highest value
    (-inf / +inf for floats), as ONNX defines it (TVM's kernel never runs its init over an empty loop)."""

    report_name, ops = "reduce_empty_set", ("ReduceMax", "ReduceMin")

    def check_node(self, node: ir.Node) -> MatchResult:
        given, kind, axes_value = shape(node.inputs[0]), dtype(node.inputs[0]), input_(node, 1)
        axes_input = const(axes_value)
        if given is None or kind is None or (axes_value is not None and axes_input is None):
            return MatchResult().fail("shape / type unknown, or axes not constant")
        axes_given = axes_input.reshape(-1).tolist() if axes_input is not None else attr(node, "axes")
        if not axes_given and attr(node, "noop_with_empty_axes", 0):
            return MatchResult().fail("no axes: a no-op")
        self.axes = {int(a) % len(given) for a in axes_given} if axes_given else set(range(len(given)))
        if not any(given[a] == 0 for a in self.axes):
            return MatchResult().fail("no reduced axis of size 0")
        if kind not in FLOATS and np.dtype(np_dtype(node.inputs[0])).kind not in "iu":
            return MatchResult().fail("neither float nor integer")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        given, kind, is_max = shape(x), np_dtype(x), node.op_type == "ReduceMax"
        assert given is not None  # checked
        if dtype(x) in FLOATS:
            fill = -np.inf if is_max else np.inf
        else:
            fill = np.iinfo(kind).min if is_max else np.iinfo(kind).max
        keep = attr(node, "keepdims", 1)
        out_shape = [1 if a in self.axes else d for a, d in enumerate(given) if keep or a not in self.axes]
        return constant(op, np.full(out_shape, fill, kind))
