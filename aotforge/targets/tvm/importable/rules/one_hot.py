"""OneHot with constant depth / values as Equal against a range, then Where (TVM wants int on/off values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    NodeRule,
    attr,
    const,
    constant,
    shape,
)


class OneHot(NodeRule):
    """OneHot with constant depth / values as Equal against a range, then Where (TVM wants int on/off values)."""

    report_name, ops = "one_hot", ("OneHot",)
    shaped, constants = (0,), (1, 2)

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
