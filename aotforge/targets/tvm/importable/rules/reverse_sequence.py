"""ReverseSequence over a static shape as GatherElements along the time axis (not in the importer):"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    constant,
    shape,
)


class ReverseSequence(NodeRule):
    """ReverseSequence over a static shape as GatherElements along the time axis (not in the importer):
    position t of row b reads ``lens[b] - 1 - t`` below that row's length, t itself from there on."""

    report_name, ops = "reverse_sequence", ("ReverseSequence",)
    shaped = (0,)

    def check_node(self, node: ir.Node) -> MatchResult:
        return MatchResult() if len(shape(node.inputs[0]) or ()) >= 2 else MatchResult().fail("input of rank < 2")

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
