"""Rewrites of shape ops whose shape / depth / dtype the importer reads wrongly."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotforge.targets.tvm.importable.rules.base import Graph, attr, make


def expand_against_ones(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Expand broadcasts both ways (a 1 in ``shape`` keeps the input's dim); TVM takes ``shape`` as the result."""
    if node.op_type != "Expand":
        return None
    shape, given = g.constants.get(node.input[1]), g.shapes.get(node.input[0])
    if shape is None or given is None:
        return None
    full = tuple(int(d) for d in np.broadcast_shapes(given, tuple(int(d) for d in shape)))
    if full == tuple(int(d) for d in shape):
        return None
    name, const = g.constant(node.input[1] + "_broadcast", np.array(full, np.int64))
    return [const, helper.make_node("Expand", [node.input[0], name], list(node.output), name=node.name)]


def one_hot(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """OneHot with constant depth / values as Equal against a range, then Where (TVM wants int on/off values)."""
    if node.op_type != "OneHot":
        return None
    depth, values = g.constants.get(node.input[1]), g.constants.get(node.input[2])
    shape = g.shapes.get(node.input[0])
    if depth is None or values is None or shape is None:
        return None
    n = int(depth.reshape(-1)[0])
    rank = len(shape) + 1
    axis = int(attr(node, "axis", -1)) % rank
    positions = np.arange(n, dtype=np.int64).reshape([n if k == axis else 1 for k in range(rank)])
    pos, pos_node = g.constant("onehot_positions", positions)
    nn, n_node = g.constant("onehot_depth", np.array(n, np.int64))
    zero, zero_node = g.constant("onehot_zero", np.array(0, np.int64))
    off, off_node = g.constant("onehot_off", values.reshape(-1)[:1].reshape(()))
    on, on_node = g.constant("onehot_on", values.reshape(-1)[1:2].reshape(()))
    idx, neg, wrapped, fixed, unsq, hit = (
        g.fresh(f"{node.output[0]}_{k}") for k in ("i64", "neg", "wrap", "fix", "u", "hit")
    )
    return [
        pos_node, n_node, zero_node, off_node, on_node,
        make("Cast", [node.input[0]], [idx], to=onnx.TensorProto.INT64),
        make("Less", [idx, zero], [neg]),
        make("Add", [idx, nn], [wrapped]),
        make("Where", [neg, wrapped, idx], [fixed]),
        *g.axes_op("Unsqueeze", [fixed], [unsq], [axis]),
        make("Equal", [unsq, pos], [hit]),
        make("Where", [hit, on, off], list(node.output)),
    ]  # fmt: skip


def eye_like_dtype(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """EyeLike with a ``dtype`` other than its input's, as EyeLike then Cast (the importer wants them equal)."""
    if node.op_type != "EyeLike":
        return None
    dtype, given = attr(node, "dtype"), g.dtypes.get(node.input[0])
    if dtype is None or given is None or dtype == given:
        return None
    eye = g.fresh(node.output[0] + "_eye")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "dtype"}
    return [make("EyeLike", [node.input[0]], [eye], **attrs), make("Cast", [eye], [node.output[0]], to=dtype)]


def split_empty_parts(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Split with zero-size parts: those parts are empty constants, the others Slices (TVM's split needs
    strictly rising indices)."""
    if node.op_type != "Split" or len(node.input) < 2 or not node.input[1]:
        return None
    parts, shape = g.constants.get(node.input[1]), g.shapes.get(node.input[0])
    if parts is None or shape is None or node.input[0] not in g.dtypes or not (parts == 0).any():
        return None
    axis = int(attr(node, "axis", 0)) % len(shape)
    axes, axes_node = g.constant("split_axis", np.array([axis], np.int64))
    nodes, start = [axes_node], 0
    for size, out in zip((int(p) for p in parts), node.output, strict=True):
        if size == 0:
            empty = np.zeros([0 if d == axis else n for d, n in enumerate(shape)], g.np_dtype(node.input[0]))
            nodes.append(make("Constant", [], [out], value=numpy_helper.from_array(empty)))
        else:
            begin, begin_node = g.constant("split_begin", np.array([start], np.int64))
            end, end_node = g.constant("split_end", np.array([start + size], np.int64))
            nodes += [begin_node, end_node, make("Slice", [node.input[0], begin, end, axes], [out])]
        start += size
    return nodes


def reverse_sequence(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """ReverseSequence over a static shape as GatherElements along the time axis (not in the importer):
    position t of row b reads ``lens[b] - 1 - t`` below that row's length, t itself from there on."""
    shape = g.shapes.get(node.input[0])
    if node.op_type != "ReverseSequence" or shape is None or len(shape) < 2:
        return None
    time, batch = int(attr(node, "time_axis", 0)), int(attr(node, "batch_axis", 1))
    out = node.output[0]
    steps = np.arange(shape[time], dtype=np.int64).reshape([-1 if d == time else 1 for d in range(len(shape))])
    t, t_node = g.constant("reverse_steps", steps)
    one, one_node = g.constant("reverse_one", np.array(1, np.int64))
    rows, rows_node = g.constant("reverse_rows", np.array([-1 if d == batch else 1 for d in range(len(shape))]))
    full, full_node = g.constant("reverse_shape", np.array(shape, np.int64))
    lens, inside, last, back, index, wide = (
        g.fresh(f"{out}_{k}") for k in ("lens", "inside", "last", "back", "index", "wide")
    )
    return [
        t_node, one_node, rows_node, full_node,
        make("Reshape", [node.input[1], rows], [lens]),
        make("Less", [t, lens], [inside]),
        make("Sub", [lens, one], [last]),
        make("Sub", [last, t], [back]),
        make("Where", [inside, back, t], [index]),
        make("Expand", [index, full], [wide]),
        make("GatherElements", [node.input[0], wide], [out], axis=time),
    ]  # fmt: skip
