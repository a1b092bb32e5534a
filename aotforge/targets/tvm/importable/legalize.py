"""Rewrites, on the ONNX graph, of ops TVM's importer lacks or computes wrongly into ops it imports right.

Each rule takes one main-graph node (with the graph's constants and inferred static shapes at hand)
and returns the nodes that replace it, or None to leave it alone. Rules run once, in order, after
the shapes are bound and folded, so shape-like inputs are constants here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper


@dataclasses.dataclass
class Graph:
    """What a rule may look at: constants by name, static shapes and element types by name."""

    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, int]
    names: set[str]

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def constant(self, base: str, value: np.ndarray) -> tuple[str, onnx.NodeProto]:
        name = self.fresh(base)
        return name, helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


Rule = Callable[[onnx.NodeProto, Graph], "list[onnx.NodeProto] | None"]


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


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


def isinf_one_sign(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """IsInf with one of detect_positive / detect_negative off is an Equal to that infinity (TVM ignores both)."""
    if node.op_type != "IsInf":
        return None
    positive, negative = _attr(node, "detect_positive", 1), _attr(node, "detect_negative", 1)
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


def conv_transpose_output_shape(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """ConvTranspose's ``output_shape`` as the pads (and output_padding) it implies (TVM ignores it)."""
    if node.op_type != "ConvTranspose":
        return None
    output_shape = _attr(node, "output_shape")
    x, w = g.shapes.get(node.input[0]), g.shapes.get(node.input[1])
    if not output_shape or x is None or w is None:
        return None
    spatial = len(x) - 2
    out = list(output_shape)[-spatial:]
    strides = list(_attr(node, "strides", [1] * spatial))
    dilations = list(_attr(node, "dilations", [1] * spatial))
    kernel = list(_attr(node, "kernel_shape", list(w[2:])))
    extra = list(_attr(node, "output_padding", [0] * spatial))
    upper = _attr(node, "auto_pad", b"NOTSET") != b"SAME_LOWER"
    begin, end, padding = [], [], []
    for i in range(spatial):
        total = strides[i] * (x[2 + i] - 1) + extra[i] + ((kernel[i] - 1) * dilations[i] + 1) - out[i]
        short = max(0, -total)  # an output larger than the kernel reaches: the rest is output_padding
        total = max(0, total)
        first = total // 2 if upper else total - total // 2
        begin.append(first)
        end.append(total - first)
        padding.append(extra[i] + short)
    keep = [a for a in node.attribute if a.name not in ("output_shape", "pads", "auto_pad", "output_padding")]
    new = helper.make_node("ConvTranspose", list(node.input), list(node.output), name=node.name)
    new.attribute.extend(keep)
    new.attribute.extend([helper.make_attribute("pads", begin + end), helper.make_attribute("output_padding", padding)])
    return [new]


def _node(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, **attrs)


def pow_mixed_types(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Pow with an exponent of another type (TVM wants one), or of integers (TVM's power is float only)."""
    if node.op_type != "Pow":
        return None
    base, exponent = g.dtypes.get(node.input[0]), g.dtypes.get(node.input[1])
    if base is None or exponent is None:
        return None
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    if base in floats and exponent != base:
        cast = g.fresh(node.input[1] + "_as_base")
        return [_node("Cast", [node.input[1]], [cast], to=base), _node("Pow", [node.input[0], cast], list(node.output))]
    if base not in floats:  # integers: exact through float64 up to 2**53
        a, b, y = g.fresh(node.input[0] + "_f64"), g.fresh(node.input[1] + "_f64"), g.fresh(node.output[0] + "_f64")
        double = onnx.TensorProto.DOUBLE
        return [
            _node("Cast", [node.input[0]], [a], to=double),
            _node("Cast", [node.input[1]], [b], to=double),
            _node("Pow", [a, b], [y]),
            _node("Cast", [y], [node.output[0]], to=base),
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
        _node("Exp", [x], [pos]),
        _node("Neg", [x], [negx]),
        _node("Exp", [negx], [neg]),
        _node("Sub" if node.op_type == "Sinh" else "Add", [pos, neg], [diff]),
        _node("Mul", [diff, half], list(node.output)),
    ]


def lp_normalization(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """LpNormalization as x / ReduceL1|L2(x, axis, keepdims) (not in the importer)."""
    if node.op_type != "LpNormalization":
        return None
    axis, p = int(_attr(node, "axis", -1)), int(_attr(node, "p", 2))
    if p not in (1, 2):
        return None
    dtype = g.dtypes.get(node.input[0])
    if dtype is None:
        return None
    axes, const = g.constant("lp_axes", np.array([axis], np.int64))
    zero, zero_node = g.constant("lp_zero", np.array(0, helper.tensor_dtype_to_np_dtype(dtype)))
    one, one_node = g.constant("lp_one", np.array(1, helper.tensor_dtype_to_np_dtype(dtype)))
    norm, empty, safe = (g.fresh(f"{node.output[0]}_{k}") for k in ("norm", "empty", "safe"))
    return [
        const, zero_node, one_node,
        _node(f"ReduceL{p}", [node.input[0], axes], [norm], keepdims=1),
        _node("Equal", [norm, zero], [empty]),
        _node("Where", [empty, one, norm], [safe]),  # a zero vector stays zero, as ONNX Runtime gives
        _node("Div", [node.input[0], safe], list(node.output)),
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
    exclusive, reverse = bool(_attr(node, "exclusive", 0)), bool(_attr(node, "reverse", 0))
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
        _node("Unsqueeze", [node.input[0], unsq], [x1]),
        _node("Where", [mask, x1, one], [picked]),
        _node("ReduceProd", [picked, red], list(node.output), keepdims=0),
    ]


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
    axis = int(_attr(node, "axis", -1)) % rank
    positions = np.arange(n, dtype=np.int64).reshape([n if k == axis else 1 for k in range(rank)])
    pos, pos_node = g.constant("onehot_positions", positions)
    nn, n_node = g.constant("onehot_depth", np.array(n, np.int64))
    zero, zero_node = g.constant("onehot_zero", np.array(0, np.int64))
    off, off_node = g.constant("onehot_off", values.reshape(-1)[:1].reshape(()))
    on, on_node = g.constant("onehot_on", values.reshape(-1)[1:2].reshape(()))
    ax, ax_node = g.constant("onehot_axis", np.array([axis], np.int64))
    idx, neg, wrapped, fixed, unsq, hit = (
        g.fresh(f"{node.output[0]}_{k}") for k in ("i64", "neg", "wrap", "fix", "u", "hit")
    )
    return [
        pos_node, n_node, zero_node, off_node, on_node, ax_node,
        _node("Cast", [node.input[0]], [idx], to=onnx.TensorProto.INT64),
        _node("Less", [idx, zero], [neg]),
        _node("Add", [idx, nn], [wrapped]),
        _node("Where", [neg, wrapped, idx], [fixed]),
        _node("Unsqueeze", [fixed, ax], [unsq]),
        _node("Equal", [unsq, pos], [hit]),
        _node("Where", [hit, on, off], list(node.output)),
    ]  # fmt: skip


def reduce_bool(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """ReduceMax / ReduceMin of bools through uint8 (TVM has no min/max value for bool)."""
    if node.op_type not in ("ReduceMax", "ReduceMin") or g.dtypes.get(node.input[0]) != onnx.TensorProto.BOOL:
        return None
    as_int, reduced = g.fresh(node.input[0] + "_u8"), g.fresh(node.output[0] + "_u8")
    reduce = onnx.NodeProto()
    reduce.CopyFrom(node)
    reduce.input[0], reduce.output[0] = as_int, reduced
    return [
        _node("Cast", [node.input[0]], [as_int], to=onnx.TensorProto.UINT8),
        reduce,
        _node("Cast", [reduced], [node.output[0]], to=onnx.TensorProto.BOOL),
    ]


def reduce_extreme_infinity(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Float ReduceMax / ReduceMin whose every value is -inf / +inf (or none, an empty set) gives that infinity.

    TVM starts a max reduction at the lowest finite value (a min at the highest), so a row of -inf
    (an attention row fully masked) came out as -3.4e38. Where the result is that value and no
    element equals it, the answer is the infinity: a second reduction of ``x == lowest`` says which.
    """
    if node.op_type not in ("ReduceMax", "ReduceMin"):
        return None
    dtype = g.dtypes.get(node.input[0])
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    if dtype not in floats:
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
        _node("Equal", [node.input[0], edge_name], [hits]),
        _node("Cast", [hits], [hits8], to=onnx.TensorProto.UINT8),
        second,
        _node("Equal", [reduced, edge_name], [at_edge]),
        _node("Equal", [has, zero], [none]),
        _node("And", [at_edge, none], [empty]),
        _node("Where", [empty, inf_name, reduced], [out]),
    ]  # fmt: skip


def resize_full_rank(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Resize with ``axes`` or a keep_aspect_ratio_policy, as a Resize of every axis (TVM reads neither).

    scales / sizes / roi over ``axes`` become full-rank constants (1, the input's size, the whole
    range elsewhere); not_larger / not_smaller become the sizes they pick, where those sizes have
    the ratio the policy's one scale gives (else the coordinates would differ: left alone).
    """
    if node.op_type != "Resize" or len(node.input) < 3:
        return None
    axes_attr, policy = _attr(node, "axes"), _attr(node, "keep_aspect_ratio_policy", b"stretch")
    if axes_attr is None and policy == b"stretch":
        return None
    shape = g.shapes.get(node.input[0])
    if shape is None:
        return None
    rank = len(shape)
    axes = [int(a) % rank for a in (axes_attr if axes_attr is not None else range(rank))]
    roi_name = node.input[1] if len(node.input) > 1 else ""
    scales_name = node.input[2] if len(node.input) > 2 else ""
    sizes_name = node.input[3] if len(node.input) > 3 else ""
    roi = g.constants.get(roi_name) if roi_name else None
    scales = g.constants.get(scales_name) if scales_name else None
    sizes = g.constants.get(sizes_name) if sizes_name else None
    if (roi_name and roi is None) or (scales_name and scales is None) or (sizes_name and sizes is None):
        return None
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        return None
    new_inputs = [node.input[0], "", "", ""]
    nodes: list[onnx.NodeProto] = []
    if roi is not None and roi.size:
        full = np.concatenate([np.zeros(rank), np.ones(rank)]).astype(roi.dtype)
        for i, d in enumerate(axes):
            full[d], full[rank + d] = roi[i], roi[len(axes) + i]
        new_inputs[1], const = g.constant("resize_roi", full)
        nodes.append(const)
    if scales is not None:
        if policy != b"stretch":
            return None
        full_scales = np.ones(rank, scales.dtype)
        full_scales[axes] = scales.reshape(-1)
        new_inputs[2], const = g.constant("resize_scales", full_scales)
    else:
        assert sizes is not None
        full_sizes = np.array(shape, np.int64)
        full_sizes[axes] = sizes.reshape(-1)
        if policy != b"stretch":
            ratios = [full_sizes[d] / shape[d] for d in axes]
            scale = min(ratios) if policy == b"not_larger" else max(ratios)
            full_sizes = np.array([int(scale * shape[d] + 0.5) if d in axes else shape[d] for d in range(rank)])
            if any(full_sizes[d] / shape[d] != scale for d in axes):
                return None
        new_inputs[3], const = g.constant("resize_sizes", full_sizes.astype(np.int64))
    nodes.append(const)
    while new_inputs and not new_inputs[-1]:
        new_inputs.pop()
    resize = helper.make_node("Resize", new_inputs, list(node.output), name=node.name)
    resize.attribute.extend(a for a in node.attribute if a.name not in ("axes", "keep_aspect_ratio_policy"))
    return [*nodes, resize]


def elu_in_float32(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Elu / Celu of float16 / bfloat16 / double through float32 (the importer's constants are float32)."""
    if node.op_type not in ("Elu", "Celu"):
        return None
    dtype = g.dtypes.get(node.input[0])
    if dtype not in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE):
        return None
    x32, y32 = g.fresh(node.input[0] + "_f32"), g.fresh(node.output[0] + "_f32")
    op = onnx.NodeProto()
    op.CopyFrom(node)
    op.input[0], op.output[0] = x32, y32
    return [
        _node("Cast", [node.input[0]], [x32], to=onnx.TensorProto.FLOAT),
        op,
        _node("Cast", [y32], [node.output[0]], to=dtype),
    ]


def eye_like_dtype(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """EyeLike with a ``dtype`` other than its input's, as EyeLike then Cast (the importer wants them equal)."""
    if node.op_type != "EyeLike":
        return None
    dtype, given = _attr(node, "dtype"), g.dtypes.get(node.input[0])
    if dtype is None or given is None or dtype == given:
        return None
    eye = g.fresh(node.output[0] + "_eye")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "dtype"}
    return [_node("EyeLike", [node.input[0]], [eye], **attrs), _node("Cast", [eye], [node.output[0]], to=dtype)]


def shift_left_out_of_range(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """BitShift LEFT by a negative amount or by the width or more gives 0 (ONNX reads the amount unsigned;
    LLVM's shl is undefined there)."""
    if node.op_type != "BitShift" or _attr(node, "direction") != b"LEFT" or node.input[1] not in g.dtypes:
        return None
    dtype = helper.tensor_dtype_to_np_dtype(g.dtypes[node.input[1]])
    # y > width - 1: GreaterOrEqual is opset 12, BitShift opset 11
    width, wnode = g.constant("shift_width", np.array(8 * dtype.itemsize - 1, dtype))
    zero, znode = g.constant("shift_zero", np.array(0, dtype))
    y = node.input[1]
    big, small, out, safe, shifted = (g.fresh(f"{node.output[0]}_{k}") for k in ("ge", "neg", "out", "safe", "shl"))
    return [
        wnode, znode,
        _node("Greater", [y, width], [big]),
        _node("Less", [y, zero], [small]),
        _node("Or", [big, small], [out]),
        _node("Where", [out, zero, y], [safe]),
        _node("BitShift", [node.input[0], safe], [shifted], direction="LEFT"),
        _node("Where", [out, zero, shifted], list(node.output)),
    ]  # fmt: skip


#: In the order they run.
RULES: tuple[Rule, ...] = (
    expand_against_ones,
    isinf_one_sign,
    conv_transpose_output_shape,
    pow_mixed_types,
    sinh_by_exp,
    lp_normalization,
    cum_prod,
    one_hot,
    reduce_bool,
    reduce_extreme_infinity,
    resize_full_rank,
    elu_in_float32,
    eye_like_dtype,
    shift_left_out_of_range,
)


#: The ops some rule may rewrite.
RULE_OPS = frozenset(
    ("Expand", "IsInf", "ConvTranspose", "Pow", "Sinh", "Cosh", "LpNormalization", "CumProd", "OneHot")
    + ("ReduceMax", "ReduceMin", "BitShift", "Resize", "Elu", "Celu", "EyeLike")
)


def tensor_constants(model: onnx.ModelProto) -> int:
    """Constant nodes given as value_int(s) / value_float(s) rewritten with a tensor (the importer reads only that)."""
    count = 0
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.attribute or node.attribute[0].name in ("value", "sparse_value"):
            continue
        value = np.asarray(helper.get_attribute_value(node.attribute[0]))
        if node.attribute[0].name in ("value_float", "value_floats"):
            value = value.astype(np.float32)
        elif node.attribute[0].name in ("value_int", "value_ints"):
            value = value.astype(np.int64)
        else:
            continue
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value, node.output[0])))
        count += 1
    return count


def legalize(model: onnx.ModelProto, rules: tuple[Rule, ...] = RULES) -> Counter[str]:
    """Rewrite the main graph in place; counts by rule."""
    if not any(n.op_type in RULE_OPS for n in model.graph.node):  # shape inference costs a copy of the model
        return Counter()
    g = _graph(model)
    counts: Counter[str] = Counter()
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        for rule in rules if node.domain in ("", "ai.onnx") else ():
            replaced = rule(node, g)
            if replaced is not None:
                nodes.extend(replaced)
                counts[rule.__name__] += 1
                break
        else:
            nodes.append(node)
    if counts:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return counts


def _graph(model: onnx.ModelProto) -> Graph:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    except Exception:  # rules that need a shape then leave their nodes alone
        inferred = model.graph
    shapes, dtypes = {}, {}
    for v in [*inferred.input, *inferred.value_info, *inferred.output]:
        t = v.type.tensor_type
        if v.type.HasField("tensor_type"):
            dtypes[v.name] = t.elem_type
            if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
                shapes[v.name] = tuple(d.dim_value for d in t.shape.dim)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    for name, value in constants.items():
        shapes.setdefault(name, value.shape)
        dtypes.setdefault(name, helper.np_dtype_to_tensor_dtype(value.dtype))
    names = {n for node in model.graph.node for n in [*node.input, *node.output]} | set(constants)
    return Graph(constants, shapes, dtypes, names | {v.name for v in model.graph.input})
