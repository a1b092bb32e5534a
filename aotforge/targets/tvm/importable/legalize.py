"""Rewrites, on the ONNX graph, of ops TVM's importer lacks or computes wrongly into ops it imports right.

The rules live in ``rules/``, one module per rule, each an onnxscript rewrite rule about one op
(``rules/base.py``); this module runs them through onnxscript's rewriter, once per node, in order, after
the shapes are bound and folded, so shape-like inputs are constants here.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes
from onnxscript.rewriter import pattern

from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset
from aotforge.targets.tvm.importable.rules import (
    batch_norm_training,
    bitcast,
    col2im,
    conv_transpose_output_shape,
    cum_prod,
    elu_in_float32,
    expand_against_ones,
    eye_like_dtype,
    isinf_one_sign,
    lp_normalization,
    one_hot,
    pow_mixed_types,
    qlinear_matmul,
    recurrent,
    reduce_bool,
    reduce_empty_set,
    reduce_extreme_infinity,
    resize_by_taps,
    resize_full_rank,
    reverse_sequence,
    shift_left_out_of_range,
    sinh_by_exp,
    split_empty_parts,
    tfidf_vectorizer,
    upsample_nearest,
)
from aotforge.targets.tvm.importable.rules.base import NodeRule, RuleRun

#: In the order they run (the first that takes a node rewrites it).
RULES: tuple[type[NodeRule], ...] = (
    expand_against_ones.ExpandAgainstOnes,
    isinf_one_sign.IsInfOneSign,
    conv_transpose_output_shape.ConvTransposeOutputShape,
    pow_mixed_types.PowMixedTypes,
    sinh_by_exp.SinhByExp,
    lp_normalization.LpNormalization,
    cum_prod.CumProd,
    one_hot.OneHot,
    reduce_bool.ReduceBool,
    reduce_empty_set.ReduceEmptySet,
    reduce_extreme_infinity.ReduceExtremeInfinity,
    resize_full_rank.ResizeFullRank,
    resize_by_taps.ResizeByTaps,
    elu_in_float32.EluInFloat32,
    eye_like_dtype.EyeLikeDtype,
    shift_left_out_of_range.ShiftLeftOutOfRange,
    qlinear_matmul.QLinearMatMul,
    col2im.Col2Im,
    split_empty_parts.SplitEmptyParts,
    bitcast.BitCast,
    recurrent.Recurrent,
    tfidf_vectorizer.TfIdfVectorizer,
    batch_norm_training.BatchNormTraining,
    reverse_sequence.ReverseSequence,
    upsample_nearest.UpsampleNearest,
)

#: The ops some rule may rewrite.
RULE_OPS = frozenset(op for rule in RULES for op in rule.ops)

_RECURRENT = (
    "unrolled only with constant weights (W, R, B), activations without alpha / beta, a static sequence of at most "
    f"{recurrent.MAX_STEPS} steps, and sequence_lens other than the full length on forward passes only"
)
#: Ops the importer lacks that a rule rewrites only in some forms: why one left alone is refused.
PARTLY = {
    "QLinearMatMul": "rewritten only with per-tensor (one-element) scales and zero points",
    "Col2Im": f"rewritten only with static shapes, constant image / block shapes, at most {col2im.MAX_COL2IM} columns",
    "BitCast": (
        "rewritten only between integer types of one width, float32 and 32-bit integers, and float64 to 64-bit "
        "integers (64-bit integers to float64 compile to wrong values through TVM)"
    ),
    "TfIdfVectorizer": "rewritten only over integer tokens (pool_int64s) in [C] or [B, C] of static size",
    "RNN": _RECURRENT,
    "GRU": _RECURRENT,
    "LSTM": _RECURRENT,
}


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
        self.stats = {**run.counts, **({"declined": dict(sorted(run.declined.items()))} if run.declined else {})}
        return onnx_ir.passes.PassResult(model, modified=bool(run.counts))
