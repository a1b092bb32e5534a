"""Upsample (opset 7-9, before Resize existed) nearest by whole constant scales as one Gather per"""

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
    shape,
)


class UpsampleNearest(NodeRule):
    """Upsample (opset 7-9, before Resize existed) nearest by whole constant scales as one Gather per
    scaled axis (each element repeated ``scale`` times, as onnx's reference does)."""

    report_name, ops = "upsample_nearest", ("Upsample",)
    shaped = (0,)

    def check_node(self, node: ir.Node) -> MatchResult:
        given = shape(node.inputs[0])
        if attr(node, "mode", "nearest") != "nearest" or given is None:
            return MatchResult().fail("not nearest")
        self.scales = const(input_(node, 1)) if len(node.inputs) > 1 else np.array(attr(node, "scales") or [])
        if self.scales is None or len(self.scales) != len(given) or (self.scales != np.round(self.scales)).any():
            return MatchResult().fail("scales not whole constants, one per axis")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, given = node.inputs[0], shape(node.inputs[0])
        assert given is not None and self.scales is not None  # checked
        for axis, scale in enumerate(int(s) for s in self.scales):
            if scale != 1:
                index = np.repeat(np.arange(given[axis], dtype=np.int64), scale)
                x = op.Gather(x, constant(op, index), axis=axis)
        return op.Identity(x)
