"""Rewrites of shape ops whose shape / depth / dtype the importer reads wrongly."""

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
    const,
    constant,
    dtype,
    input_,
    np_dtype,
    shape,
)


class ExpandAgainstOnes(NodeRule):
    """Expand broadcasts both ways (a 1 in ``shape`` keeps the input's dim); TVM takes ``shape`` as the result."""

    report_name, ops = "expand_against_ones", ("Expand",)

    def check_node(self, node: ir.Node) -> MatchResult:
        wanted, given = const(node.inputs[1]), shape(node.inputs[0])
        if wanted is None or given is None:
            return MatchResult().fail("shape not constant, or input shape unknown")
        self.full = tuple(int(d) for d in np.broadcast_shapes(given, tuple(int(d) for d in wanted)))
        if self.full == tuple(int(d) for d in wanted):
            return MatchResult().fail("shape is the result: TVM's own")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return op.Expand(node.inputs[0], constant(op, np.array(self.full, np.int64)))


class OneHot(NodeRule):
    """OneHot with constant depth / values as Equal against a range, then Where (TVM wants int on/off values)."""

    report_name, ops = "one_hot", ("OneHot",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if const(node.inputs[1]) is None or const(node.inputs[2]) is None or shape(node.inputs[0]) is None:
            return MatchResult().fail("depth / values not constant, or indices' shape unknown")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        depth, values, given = const(node.inputs[1]), const(node.inputs[2]), shape(node.inputs[0])
        assert depth is not None and values is not None and given is not None  # checked
        n = int(depth.reshape(-1)[0])
        rank = len(given) + 1
        axis = int(attr(node, "axis", -1)) % rank
        positions = np.arange(n, dtype=np.int64).reshape([n if k == axis else 1 for k in range(rank)])
        off = constant(op, values.reshape(-1)[:1].reshape(()))
        on = constant(op, values.reshape(-1)[1:2].reshape(()))
        idx = op.Cast(node.inputs[0], to=onnx.TensorProto.INT64)
        fixed = op.Where(
            op.Less(idx, constant(op, np.array(0, np.int64))), op.Add(idx, constant(op, np.array(n, np.int64))), idx
        )
        hit = op.Equal(self.axes_op(op, "Unsqueeze", [fixed], [axis]), constant(op, positions))
        return op.Where(hit, on, off)


class EyeLikeDtype(NodeRule):
    """EyeLike with a ``dtype`` other than its input's, as EyeLike then Cast (the importer wants them equal)."""

    report_name, ops = "eye_like_dtype", ("EyeLike",)

    def check_node(self, node: ir.Node) -> MatchResult:
        wanted, given = attr(node, "dtype"), dtype(node.inputs[0])
        if wanted is None or given is None or wanted == given:
            return MatchResult().fail("no dtype other than the input's")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return op.Cast(op.EyeLike(node.inputs[0], **attributes(node, "dtype")), to=attr(node, "dtype"))


class SplitEmptyParts(NodeRule):
    """Split with zero-size parts: those parts are empty constants, the others Slices (TVM's split needs
    strictly rising indices)."""

    report_name, ops = "split_empty_parts", ("Split",)
    outputs = range(1, 65)

    def check_node(self, node: ir.Node) -> MatchResult:
        parts, given = const(input_(node, 1)), shape(node.inputs[0])
        if parts is None or given is None or dtype(node.inputs[0]) is None or not (parts == 0).any():
            return MatchResult().fail("no constant split with a zero-size part over a known shape")
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


class ReverseSequence(NodeRule):
    """ReverseSequence over a static shape as GatherElements along the time axis (not in the importer):
    position t of row b reads ``lens[b] - 1 - t`` below that row's length, t itself from there on."""

    report_name, ops = "reverse_sequence", ("ReverseSequence",)

    def check_node(self, node: ir.Node) -> MatchResult:
        given = shape(node.inputs[0])
        return MatchResult() if given is not None and len(given) >= 2 else MatchResult().fail("shape unknown")

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        given = shape(node.inputs[0])
        assert given is not None  # checked
        time, batch = int(attr(node, "time_axis", 0)), int(attr(node, "batch_axis", 1))
        steps = np.arange(given[time], dtype=np.int64).reshape([-1 if d == time else 1 for d in range(len(given))])
        t = constant(op, steps)
        rows = constant(op, np.array([-1 if d == batch else 1 for d in range(len(given))]))
        lens = op.Reshape(node.inputs[1], rows)
        back = op.Sub(op.Sub(lens, constant(op, np.array(1, np.int64))), t)
        index = op.Where(op.Less(t, lens), back, t)
        wide = op.Expand(index, constant(op, np.array(given, np.int64)))
        return op.GatherElements(node.inputs[0], wide, axis=time)
