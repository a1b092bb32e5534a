"""Rewrites, on the ONNX graph, of ops TVM's importer lacks or computes wrongly into ops it imports right.

The rules live in ``rules/``, one module per family of ops; this module runs them: each rule takes
one main-graph node and returns the nodes that replace it, or None to leave it alone. Rules run
once, in order, after the shapes are bound and folded, so shape-like inputs are constants here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes
from onnx import helper

from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset, static_shape
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
from aotforge.targets.tvm.importable.splice import Names, constants, splice

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


class ConstantsAsTensorsPass(ImportStep):
    """Constant nodes given as value_int(s) / value_float(s) rewritten with a tensor (the importer reads only that)."""

    name = "constants_as_tensors"
    folds = False
    may_fail = False

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        count = 0
        for node in model.graph:
            first = next(iter(node.attributes.values()), None)
            if node.op_type != "Constant" or first is None or first.name not in _LISTS:
                continue
            value = np.asarray(first.value, _LISTS[first.name])
            node.attributes.pop(first.name)
            name = node.outputs[0].name
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor(value, name=name))
            count += 1
        self.stats = {"count": count}
        return onnx_ir.passes.PassResult(model, modified=bool(count))

    def report(self) -> Any:
        return self.stats["count"]


_LISTS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}


class LegalizePass(ImportStep):
    """Rewrite the main graph's nodes some rule takes (each once, the first rule in order); counts by rule."""

    name = "legalized"

    def __init__(self, rules: tuple[Rule, ...] = RULES) -> None:
        super().__init__()
        self.rules = rules

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        graph = model.graph
        if not any(n.op_type in RULE_OPS for n in graph):  # shape inference costs a copy of the model
            return onnx_ir.passes.PassResult(model, modified=False)
        infer_types(model)
        names = Names(graph)
        g = _graph(model, names)
        counts: Counter[str] = Counter()
        for node in list(graph):
            if node.domain not in ("", "ai.onnx") or node.op_type not in RULE_OPS:
                continue
            proto = ir.serde.serialize_node(node)
            for rule in self.rules:
                replaced = rule(proto, g)
                if replaced is not None:
                    splice(graph, node, replaced, names)
                    counts[rule.__name__] += 1
                    break
        self.stats = dict(counts)
        return onnx_ir.passes.PassResult(model, modified=bool(counts))


def _graph(model: ir.Model, names: Names) -> Graph:
    shapes, dtypes = {}, {}
    for name, value in names.values.items():
        if value.dtype is not None:
            dtypes[name] = int(value.dtype)
        shape = static_shape(value)
        if shape is not None:
            shapes[name] = shape
    found = constants(model.graph)
    for name, value in found.items():
        shapes.setdefault(name, value.shape)
        dtypes.setdefault(name, helper.np_dtype_to_tensor_dtype(value.dtype))
    return Graph(found, shapes, dtypes, names.taken, opset(model))
