"""Rewrites of reductions and scans over an axis TVM lacks or computes wrongly."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotforge.targets.tvm.importable.rules.base import FLOATS, Graph, attr, make, through_dtype


def lp_normalization(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """LpNormalization as x / ReduceL1|L2(x, axis, keepdims) (not in the importer)."""
    if node.op_type != "LpNormalization":
        return None
    axis, p = int(attr(node, "axis", -1)), int(attr(node, "p", 2))
    dtype, shape = g.dtypes.get(node.input[0]), g.shapes.get(node.input[0])
    if p not in (1, 2) or dtype is None or shape is None:
        return None
    zero, zero_node = g.constant("lp_zero", np.array(0, helper.tensor_dtype_to_np_dtype(dtype)))
    one, one_node = g.constant("lp_one", np.array(1, helper.tensor_dtype_to_np_dtype(dtype)))
    norm, empty, safe = (g.fresh(f"{node.output[0]}_{k}") for k in ("norm", "empty", "safe"))
    return [
        zero_node, one_node,
        *g.axes_op(f"ReduceL{p}", [node.input[0]], [norm], [axis % len(shape)], keepdims=1),
        make("Equal", [norm, zero], [empty]),
        make("Where", [empty, one, norm], [safe]),  # a zero vector stays zero, as ONNX Runtime gives
        make("Div", [node.input[0], safe], list(node.output)),
    ]  # fmt: skip


def cum_prod(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """CumProd over a static axis: a triangular Where of x against 1, then ReduceProd (not in the importer)."""
    if node.op_type != "CumProd":
        return None
    shape, axis_value, dtype = g.shapes.get(node.input[0]), g.constants.get(node.input[1]), g.dtypes.get(node.input[0])
    if shape is None or axis_value is None or dtype is None:
        return None
    rank = len(shape)
    axis = int(axis_value.reshape(-1)[0]) % rank
    n = shape[axis]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    exclusive, reverse = bool(attr(node, "exclusive", 0)), bool(attr(node, "reverse", 0))
    keep = (j >= i if reverse else j <= i) & (i != j if exclusive else True)
    # x moved to axis+1 (the j axis), the i axis inserted at axis: mask[i, j] broadcast over the rest.
    mask_shape = [1] * (rank + 1)
    mask_shape[axis], mask_shape[axis + 1] = n, n
    mask, mask_node = g.constant("cumprod_mask", keep.reshape(mask_shape))
    one, one_node = g.constant("cumprod_one", np.array(1, helper.tensor_dtype_to_np_dtype(dtype)))
    unsq, unsq_node = g.constant("cumprod_axis", np.array([axis], np.int64))
    red, red_node = g.constant("cumprod_reduce", np.array([axis + 1], np.int64))
    x1, picked = g.fresh(node.output[0] + "_x"), g.fresh(node.output[0] + "_picked")
    return [
        mask_node,
        one_node,
        unsq_node,
        red_node,
        make("Unsqueeze", [node.input[0], unsq], [x1]),
        make("Where", [mask, x1, one], [picked]),
        make("ReduceProd", [picked, red], list(node.output), keepdims=0),
    ]


def reduce_bool(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """ReduceMax / ReduceMin of bools through uint8 (TVM has no min/max value for bool)."""
    if node.op_type not in ("ReduceMax", "ReduceMin") or g.dtypes.get(node.input[0]) != onnx.TensorProto.BOOL:
        return None
    return through_dtype(node, g, onnx.TensorProto.UINT8, onnx.TensorProto.BOOL)


def reduce_extreme_infinity(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Float ReduceMax / ReduceMin whose every value is -inf / +inf (or none, an empty set) gives that infinity.

    TVM starts a max reduction at the lowest finite value (a min at the highest), so a row of -inf
    (an attention row fully masked) came out as -3.4e38. Where the result is that value and no
    element equals it, the answer is the infinity: a second reduction of ``x == lowest`` says which.
    """
    if node.op_type not in ("ReduceMax", "ReduceMin"):
        return None
    dtype = g.dtypes.get(node.input[0])
    if dtype not in FLOATS:
        return None
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    is_max = node.op_type == "ReduceMax"
    if dtype == onnx.TensorProto.BFLOAT16:
        import ml_dtypes

        info: Any = ml_dtypes.finfo(np_dtype)
    else:
        info = np.finfo(np_dtype)
    edge = np.array(info.min if is_max else info.max, np_dtype)
    infinity = np.array(-np.inf if is_max else np.inf, np_dtype)
    edge_name, edge_node = g.constant("reduce_edge", edge)
    inf_name, inf_node = g.constant("reduce_inf", infinity)
    zero, zero_node = g.constant("reduce_zero_u8", np.array(0, np.uint8))
    out = node.output[0]
    reduced, hits, hits8, has, at_edge, none, empty = (
        g.fresh(f"{out}_{k}") for k in ("r", "eq", "eq_u8", "has", "at_edge", "none", "inf")
    )
    first = onnx.NodeProto()
    first.CopyFrom(node)
    first.output[0] = reduced
    second = onnx.NodeProto()
    second.CopyFrom(node)
    second.name, second.op_type = "", "ReduceMax"  # any element at the edge
    second.input[0], second.output[0] = hits8, has
    return [
        edge_node, inf_node, zero_node, first,
        make("Equal", [node.input[0], edge_name], [hits]),
        make("Cast", [hits], [hits8], to=onnx.TensorProto.UINT8),
        second,
        make("Equal", [reduced, edge_name], [at_edge]),
        make("Equal", [has, zero], [none]),
        make("And", [at_edge, none], [empty]),
        make("Where", [empty, inf_name, reduced], [out]),
    ]  # fmt: skip


def reduce_empty_set(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """ReduceMax / ReduceMin over a static axis of size 0: a constant of the type's lowest / highest value
    (-inf / +inf for floats), as ONNX defines it (TVM's kernel never runs its init over an empty loop)."""
    if node.op_type not in ("ReduceMax", "ReduceMin"):
        return None
    shape, dtype = g.shapes.get(node.input[0]), g.dtypes.get(node.input[0])
    axes_input = g.constants.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if shape is None or dtype is None or (len(node.input) > 1 and node.input[1] and axes_input is None):
        return None
    axes_given = axes_input.reshape(-1).tolist() if axes_input is not None else attr(node, "axes")
    if not axes_given and attr(node, "noop_with_empty_axes", 0):
        return None
    axes = {int(a) % len(shape) for a in axes_given} if axes_given else set(range(len(shape)))
    if not any(shape[a] == 0 for a in axes):
        return None
    np_dtype, is_max = g.np_dtype(node.input[0]), node.op_type == "ReduceMax"
    if dtype in FLOATS:
        fill = -np.inf if is_max else np.inf
    elif np.dtype(np_dtype).kind in "iu":
        fill = np.iinfo(np_dtype).min if is_max else np.iinfo(np_dtype).max
    else:
        return None
    keep = attr(node, "keepdims", 1)
    out_shape = [1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes]
    value = np.full(out_shape, fill, np_dtype)
    return [make("Constant", [], [node.output[0]], value=numpy_helper.from_array(value))]
