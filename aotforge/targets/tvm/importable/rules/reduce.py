"""Rewrites of reductions and scans over an axis TVM lacks or computes wrongly."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    FLOATS,
    MatchResult,
    NodeRule,
    attr,
    attributes,
    const,
    constant,
    dtype,
    input_,
    np_dtype,
    shape,
    through_dtype,
)


class LpNormalization(NodeRule):
    """LpNormalization as x / ReduceL1|L2(x, axis, keepdims) (not in the importer)."""

    report_name, ops = "lp_normalization", ("LpNormalization",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if int(attr(node, "p", 2)) not in (1, 2) or dtype(node.inputs[0]) is None or shape(node.inputs[0]) is None:
            return MatchResult().fail("p other than 1 or 2, or input type / shape unknown")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        axis, p, rank = int(attr(node, "axis", -1)), int(attr(node, "p", 2)), len(shape(x))  # type: ignore[arg-type]
        kind = np_dtype(x)
        norm = self.axes_op(op, f"ReduceL{p}", [x], [axis % rank], keepdims=1)
        # a zero vector stays zero, as ONNX Runtime gives
        safe = op.Where(op.Equal(norm, constant(op, np.array(0, kind))), constant(op, np.array(1, kind)), norm)
        return op.Div(x, safe)


class CumProd(NodeRule):
    """CumProd over a static axis: a triangular Where of x against 1, then ReduceProd (not in the importer)."""

    report_name, ops = "cum_prod", ("CumProd",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if shape(node.inputs[0]) is None or const(node.inputs[1]) is None or dtype(node.inputs[0]) is None:
            return MatchResult().fail("shape / type unknown, or axis not constant")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        given, axis_value = shape(x), const(node.inputs[1])
        assert given is not None and axis_value is not None  # checked
        rank = len(given)
        axis = int(axis_value.reshape(-1)[0]) % rank
        n = given[axis]
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        exclusive, reverse = bool(attr(node, "exclusive", 0)), bool(attr(node, "reverse", 0))
        keep = (j >= i if reverse else j <= i) & (i != j if exclusive else True)
        # x moved to axis+1 (the j axis), the i axis inserted at axis: mask[i, j] broadcast over the rest.
        mask_shape = [1] * (rank + 1)
        mask_shape[axis], mask_shape[axis + 1] = n, n
        x1 = op.Unsqueeze(x, constant(op, np.array([axis], np.int64)))
        picked = op.Where(constant(op, keep.reshape(mask_shape)), x1, constant(op, np.array(1, np_dtype(x))))
        return op.ReduceProd(picked, constant(op, np.array([axis + 1], np.int64)), keepdims=0)


class ReduceBool(NodeRule):
    """ReduceMax / ReduceMin of bools through uint8 (TVM has no min/max value for bool)."""

    report_name, ops = "reduce_bool", ("ReduceMax", "ReduceMin")

    def check_node(self, node: ir.Node) -> MatchResult:
        if dtype(node.inputs[0]) != onnx.TensorProto.BOOL:
            return MatchResult().fail("not bool")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return through_dtype(op, node, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL)


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


#: In the order they run (reduce_empty_set before reduce_extreme_infinity: both take float ReduceMax).
RULES = (LpNormalization, CumProd, ReduceBool, ReduceEmptySet, ReduceExtremeInfinity)
