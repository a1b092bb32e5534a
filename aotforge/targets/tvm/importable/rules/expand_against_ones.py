"""Expand broadcasts both ways (a 1 in ``shape`` keeps the input's dim); TVM takes ``shape`` as the result."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    const,
    constant,
    shape,
)


class ExpandAgainstOnes(NodeRule):
    """Expand broadcasts both ways (a 1 in ``shape`` keeps the input's dim); TVM takes ``shape`` as the result."""

    report_name, ops = "expand_against_ones", ("Expand",)
    shaped, constants = (0,), (1,)

    def check_node(self, node: ir.Node) -> MatchResult:
        wanted, given = const(node.inputs[1]), shape(node.inputs[0])
        assert wanted is not None and given is not None  # declared
        self.full = tuple(int(d) for d in np.broadcast_shapes(given, tuple(int(d) for d in wanted)))
        if self.full == tuple(int(d) for d in wanted):
            return MatchResult().fail("shape is the result: TVM's own")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return op.Expand(node.inputs[0], constant(op, np.array(self.full, np.int64)))
