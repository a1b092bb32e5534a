"""CumProd over a static axis: a triangular Where of x against 1, then ReduceProd (not in the importer)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    NodeRule,
    attr,
    const,
    constant,
    np_dtype,
    shape,
)


class CumProd(NodeRule):
    """CumProd over a static axis: a triangular Where of x against 1, then ReduceProd (not in the importer)."""

    report_name, ops = "cum_prod", ("CumProd",)
    typed, shaped, constants = (0,), (0,), (1,)

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
