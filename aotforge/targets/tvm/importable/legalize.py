"""Rewrites, on the ONNX graph, of ops TVM's importer lacks or computes wrongly into ops it imports right.

The rules live in ``rules/``, one module per family of ops, each an onnxscript rewrite rule about one op
(``rules/base.py``); this module runs them through onnxscript's rewriter, once per node, in order, after
the shapes are bound and folded, so shape-like inputs are constants here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes
from onnxscript.rewriter import pattern

from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset
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
from aotforge.targets.tvm.importable.rules.base import NodeRule, RuleRun

#: In the order they run (the first that takes a node rewrites it).
RULES: tuple[type[NodeRule], ...] = (
    shapes.ExpandAgainstOnes,
    elementwise.IsInfOneSign,
    conv.ConvTransposeOutputShape,
    elementwise.PowMixedTypes,
    elementwise.SinhByExp,
    reduce.LpNormalization,
    reduce.CumProd,
    shapes.OneHot,
    reduce.ReduceBool,
    reduce.ReduceEmptySet,
    reduce.ReduceExtremeInfinity,
    resize.ResizeFullRank,
    resize.ResizeByTaps,
    elementwise.EluInFloat32,
    shapes.EyeLikeDtype,
    elementwise.ShiftLeftOutOfRange,
    quantized.QLinearMatMul,
    conv.Col2Im,
    shapes.SplitEmptyParts,
    bitcast.BitCast,
    recurrent.Recurrent,
    text.TfIdfVectorizer,
    normalization.BatchNormTraining,
    shapes.ReverseSequence,
    resize.UpsampleNearest,
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
    """Rewrite the main graph's nodes some rule takes (each once, the first rule in order; onnxscript's
    rewriter); counts by rule."""

    name = "legalized"

    def __init__(self, rules: tuple[type[NodeRule], ...] = RULES) -> None:
        super().__init__()
        self.rules = rules

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        graph = model.graph
        if not any(n.op_type in RULE_OPS for n in graph):  # shape inference costs a copy of the model
            return onnx_ir.passes.PassResult(model, modified=False)
        infer_types(model)
        run = RuleRun({n for n in graph if n.op_type in RULE_OPS}, graph, opset(model))
        pattern.RewriteRuleSet([r for rule in self.rules for r in rule.rules(run)]).apply_to_model(model)
        self.stats = dict(run.counts)
        return onnx_ir.passes.PassResult(model, modified=bool(run.counts))
