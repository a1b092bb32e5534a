"""Rewrites of elementwise ops TVM lacks or computes wrongly (types, edge values, intrinsics)."""

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
    constant,
    dtype,
    shape,
    through_dtype,
)

DOUBLE = onnx.TensorProto.DOUBLE


class IsInfOneSign(NodeRule):
    """IsInf with one of detect_positive / detect_negative off is an Equal to that infinity (TVM ignores both)."""

    report_name, ops = "isinf_one_sign", ("IsInf",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if attr(node, "detect_positive", 1) and attr(node, "detect_negative", 1):
            return MatchResult().fail("both signs detected: TVM's own")
        if dtype(node.inputs[0]) is None:
            return MatchResult().fail("input type unknown")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        positive, negative = attr(node, "detect_positive", 1), attr(node, "detect_negative", 1)
        if not positive and not negative:
            return constant(op, np.zeros(shape(x) or (), bool))
        inf = np.array(np.inf if positive else -np.inf, onnx.helper.tensor_dtype_to_np_dtype(dtype(x)))  # type: ignore[arg-type]
        return op.Equal(x, constant(op, inf))


class PowMixedTypes(NodeRule):
    """Pow with an exponent of another type (TVM wants one), or of integers (TVM's power is float only)."""

    report_name, ops = "pow_mixed_types", ("Pow",)

    def check_node(self, node: ir.Node) -> MatchResult:
        base, exponent = dtype(node.inputs[0]), dtype(node.inputs[1])
        if base is None or exponent is None:
            return MatchResult().fail("input types unknown")
        if base in FLOATS and exponent == base:
            return MatchResult().fail("float base and exponent of one type: TVM's own")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, y = node.inputs[0], node.inputs[1]
        base = dtype(x)
        if base in FLOATS:
            return op.Pow(x, op.Cast(y, to=base))
        # integers: exact through float64 up to 2**53
        return op.Cast(op.Pow(op.Cast(x, to=DOUBLE), op.Cast(y, to=DOUBLE)), to=base)


class SinhByExp(NodeRule):
    """Sinh / Cosh as (exp(x) -/+ exp(-x)) / 2 (TVM's LLVM backend has no sinh / cosh intrinsic)."""

    report_name, ops = "sinh_by_exp", ("Sinh", "Cosh")

    def check_node(self, node: ir.Node) -> MatchResult:
        return MatchResult() if dtype(node.inputs[0]) is not None else MatchResult().fail("input type unknown")

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x = node.inputs[0]
        half = constant(op, np.array(0.5, onnx.helper.tensor_dtype_to_np_dtype(dtype(x))))  # type: ignore[arg-type]
        pos, neg = op.Exp(x), op.Exp(op.Neg(x))
        return op.Mul(op.Sub(pos, neg) if node.op_type == "Sinh" else op.Add(pos, neg), half)


class EluInFloat32(NodeRule):
    """Elu / Celu of float16 / bfloat16 / double through float32 (the importer's constants are float32)."""

    report_name, ops = "elu_in_float32", ("Elu", "Celu")

    def check_node(self, node: ir.Node) -> MatchResult:
        if dtype(node.inputs[0]) not in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, DOUBLE):
            return MatchResult().fail("not float16 / bfloat16 / double")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return through_dtype(op, node, onnx.TensorProto.FLOAT, dtype(node.inputs[0]))  # type: ignore[arg-type]


class ShiftLeftOutOfRange(NodeRule):
    """BitShift LEFT by a negative amount or by the width or more gives 0 (ONNX reads the amount unsigned;
    LLVM's shl is undefined there)."""

    report_name, ops = "shift_left_out_of_range", ("BitShift",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if attr(node, "direction") != "LEFT" or dtype(node.inputs[1]) is None:
            return MatchResult().fail("not a left shift of a known type")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, y = node.inputs[0], node.inputs[1]
        kind = onnx.helper.tensor_dtype_to_np_dtype(dtype(y))  # type: ignore[arg-type]
        # y > width - 1: GreaterOrEqual is opset 12, BitShift opset 11
        width, zero = constant(op, np.array(8 * kind.itemsize - 1, kind)), constant(op, np.array(0, kind))
        out = op.Or(op.Greater(y, width), op.Less(y, zero))
        shifted = op.BitShift(x, op.Where(out, zero, y), **attributes(node))
        return op.Where(out, zero, shifted)


RULES = (IsInfOneSign, PowMixedTypes, SinhByExp, EluInFloat32, ShiftLeftOutOfRange)
