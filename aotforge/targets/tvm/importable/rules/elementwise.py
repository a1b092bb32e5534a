"""Rewrites of elementwise ops TVM lacks or computes wrongly (types, edge values, intrinsics)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotforge.targets.tvm.importable.rules.base import FLOATS, Graph, attr, make, through_dtype


def isinf_one_sign(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """IsInf with one of detect_positive / detect_negative off is an Equal to that infinity (TVM ignores both)."""
    if node.op_type != "IsInf":
        return None
    positive, negative = attr(node, "detect_positive", 1), attr(node, "detect_negative", 1)
    if positive and negative:
        return None
    dtype = g.dtypes.get(node.input[0])
    if dtype is None:
        return None
    if not positive and not negative:
        value = np.zeros(g.shapes.get(node.input[0], ()), bool)
        return [helper.make_node("Constant", [], [node.output[0]], value=numpy_helper.from_array(value))]
    inf = np.array(np.inf if positive else -np.inf, helper.tensor_dtype_to_np_dtype(dtype))
    name, const = g.constant(node.output[0] + "_inf", inf)
    return [const, helper.make_node("Equal", [node.input[0], name], [node.output[0]], name=node.name)]


def pow_mixed_types(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Pow with an exponent of another type (TVM wants one), or of integers (TVM's power is float only)."""
    if node.op_type != "Pow":
        return None
    base, exponent = g.dtypes.get(node.input[0]), g.dtypes.get(node.input[1])
    if base is None or exponent is None:
        return None
    if base in FLOATS and exponent != base:
        cast = g.fresh(node.input[1] + "_as_base")
        return [make("Cast", [node.input[1]], [cast], to=base), make("Pow", [node.input[0], cast], list(node.output))]
    if base not in FLOATS:  # integers: exact through float64 up to 2**53
        a, b, y = g.fresh(node.input[0] + "_f64"), g.fresh(node.input[1] + "_f64"), g.fresh(node.output[0] + "_f64")
        double = onnx.TensorProto.DOUBLE
        return [
            make("Cast", [node.input[0]], [a], to=double),
            make("Cast", [node.input[1]], [b], to=double),
            make("Pow", [a, b], [y]),
            make("Cast", [y], [node.output[0]], to=base),
        ]
    return None


def sinh_by_exp(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Sinh / Cosh as (exp(x) -/+ exp(-x)) / 2 (TVM's LLVM backend has no sinh / cosh intrinsic)."""
    if node.op_type not in ("Sinh", "Cosh") or node.input[0] not in g.dtypes:
        return None
    x = node.input[0]
    pos, neg, negx, diff = (g.fresh(f"{node.output[0]}_{k}") for k in ("exp", "expneg", "neg", "diff"))
    half, const = g.constant("half", np.array(0.5, helper.tensor_dtype_to_np_dtype(g.dtypes[x])))
    return [
        const,
        make("Exp", [x], [pos]),
        make("Neg", [x], [negx]),
        make("Exp", [negx], [neg]),
        make("Sub" if node.op_type == "Sinh" else "Add", [pos, neg], [diff]),
        make("Mul", [diff, half], list(node.output)),
    ]


def elu_in_float32(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Elu / Celu of float16 / bfloat16 / double through float32 (the importer's constants are float32)."""
    if node.op_type not in ("Elu", "Celu"):
        return None
    dtype = g.dtypes.get(node.input[0])
    if dtype not in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE):
        return None
    return through_dtype(node, g, onnx.TensorProto.FLOAT, dtype)


def shift_left_out_of_range(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """BitShift LEFT by a negative amount or by the width or more gives 0 (ONNX reads the amount unsigned;
    LLVM's shl is undefined there)."""
    if node.op_type != "BitShift" or attr(node, "direction") != b"LEFT" or node.input[1] not in g.dtypes:
        return None
    dtype = helper.tensor_dtype_to_np_dtype(g.dtypes[node.input[1]])
    # y > width - 1: GreaterOrEqual is opset 12, BitShift opset 11
    width, wnode = g.constant("shift_width", np.array(8 * dtype.itemsize - 1, dtype))
    zero, znode = g.constant("shift_zero", np.array(0, dtype))
    y = node.input[1]
    big, small, out, safe, shifted = (g.fresh(f"{node.output[0]}_{k}") for k in ("ge", "neg", "out", "safe", "shl"))
    return [
        wnode, znode,
        make("Greater", [y, width], [big]),
        make("Less", [y, zero], [small]),
        make("Or", [big, small], [out]),
        make("Where", [out, zero, y], [safe]),
        make("BitShift", [node.input[0], safe], [shifted], direction="LEFT"),
        make("Where", [out, zero, shifted], list(node.output)),
    ]  # fmt: skip
