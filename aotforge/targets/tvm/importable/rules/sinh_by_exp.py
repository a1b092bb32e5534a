"""Sinh / Cosh as (exp(x) -/+ exp(-x)) / 2 (TVM's LLVM backend has no sinh / cosh intrinsic)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    NodeRule,
    constant,
    dtype,
)


class SinhByExp(NodeRule):
    """Sinh / Cosh as (exp(x) -/+ exp(-x)) / 2 (TVM's LLVM backend has no sinh / cosh intrinsic)."""

    report_name, ops = "sinh_by_exp", ("Sinh", "Cosh")
    typed = (0,)

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        half = constant(op, np.array(0.5, onnx.helper.tensor_dtype_to_np_dtype(dtype(x))))  # type: ignore[arg-type]
        pos, neg = op.Exp(x), op.Exp(op.Neg(x))
        return op.Mul(op.Sub(pos, neg) if node.op_type == "Sinh" else op.Add(pos, neg), half)
