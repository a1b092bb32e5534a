"""Rewrites, on the ONNX graph, of ops TVM's importer lacks or computes wrongly into ops it imports right.

The rules live in ``rules/``, one module per family of ops; this module runs them: each rule takes
one main-graph node and returns the nodes that replace it, or None to leave it alone. Rules run
once, in order, after the shapes are bound and folded, so shape-like inputs are constants here.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aotforge.targets.tvm.importable.rules import (
    bitcast,
    conv,
    elementwise,
    normalization,
    quantized,
    recurrent,
    reduce,
    resize,
    shapes,
    text,
)
from aotforge.targets.tvm.importable.rules.base import Graph, Rule

#: In the order they run.
RULES: tuple[Rule, ...] = (
    shapes.expand_against_ones,
    elementwise.isinf_one_sign,
    conv.conv_transpose_output_shape,
    elementwise.pow_mixed_types,
    elementwise.sinh_by_exp,
    reduce.lp_normalization,
    reduce.cum_prod,
    shapes.one_hot,
    reduce.reduce_bool,
    reduce.reduce_empty_set,
    reduce.reduce_extreme_infinity,
    resize.resize_full_rank,
    resize.resize_by_taps,
    elementwise.elu_in_float32,
    shapes.eye_like_dtype,
    elementwise.shift_left_out_of_range,
    quantized.qlinear_matmul,
    conv.col2im,
    shapes.split_empty_parts,
    bitcast.bitcast,
    recurrent.recurrent,
    text.tfidf_vectorizer,
    normalization.batch_norm_training,
    shapes.reverse_sequence,
    resize.upsample_nearest,
)

#: The ops some rule may rewrite.
RULE_OPS = frozenset(
    ("Expand", "IsInf", "ConvTranspose", "Pow", "Sinh", "Cosh", "LpNormalization", "CumProd", "OneHot")
    + ("ReduceMax", "ReduceMin", "BitShift", "Resize", "Elu", "Celu", "EyeLike")
    + (
        "QLinearMatMul",
        "Col2Im",
        "Split",
        "BitCast",
        "RNN",
        "GRU",
        "LSTM",
        "TfIdfVectorizer",
        "BatchNormalization",
        "ReverseSequence",
        "Upsample",
    )
)

_RECURRENT = (
    "unrolled only with constant weights (W, R, B), activations without alpha / beta, a static sequence of at most "
    f"{recurrent.MAX_STEPS} steps, and sequence_lens other than the full length on forward passes only"
)
#: Ops the importer lacks that a rule rewrites only in some forms: why one left alone is refused.
PARTLY = {
    "QLinearMatMul": "rewritten only with per-tensor (one-element) scales and zero points",
    "Col2Im": f"rewritten only with static shapes, constant image / block shapes, at most {conv.MAX_COL2IM} columns",
    "BitCast": (
        "rewritten only between integer types of one width, float32 and 32-bit integers, and float64 to 64-bit "
        "integers (64-bit integers to float64 compile to wrong values through TVM)"
    ),
    "TfIdfVectorizer": "rewritten only over integer tokens (pool_int64s) in [C] or [B, C] of static size",
    "RNN": _RECURRENT,
    "GRU": _RECURRENT,
    "LSTM": _RECURRENT,
}


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
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    return Graph(constants, shapes, dtypes, names | {v.name for v in model.graph.input}, opset)
