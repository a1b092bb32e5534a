"""Fold inference BatchNormalization into the Conv / ConvTranspose / Gemm before it.

onnxscript's rewriter rules do the arithmetic (scale the weights, shift the bias); this pass
counts what each rule changed so the manifest says how many BatchNorms went away.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import onnx_ir.passes
from onnxscript.rewriter import RewriteRuleSet
from onnxscript.rewriter.rules.common import (
    fuse_batchnorm_into_conv_rule,
    fuse_batchnorm_into_conv_transpose_rule,
    fuse_batchnorm_into_gemm_rule,
)

from aotforge.passes.base import GraphPass

_RULES = {
    "conv_bn": fuse_batchnorm_into_conv_rule,
    "conv_transpose_bn": fuse_batchnorm_into_conv_transpose_rule,
    "gemm_bn": fuse_batchnorm_into_gemm_rule,
}


@dataclasses.dataclass(frozen=True)
class FuseConvBatchNormParams:
    #: Fold into Gemm too (a BatchNorm after a Linear layer).
    gemm: bool = True


class FuseConvBatchNormPass(GraphPass):
    name = "fuse-conv-bn"
    Params = FuseConvBatchNormParams
    #: Folding reorders float arithmetic: outputs move by rounding only.
    tolerance = 1e-4

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        counts = {}
        for pattern, rule in _RULES.items():
            if pattern == "gemm_bn" and not self.params.gemm:
                continue
            counts[pattern] = RewriteRuleSet([rule]).apply_to_model(model)
        self.stats = {"fused": counts, "batchnorm_left": _count(model, "BatchNormalization")}
        return onnx_ir.passes.PassResult(model, modified=sum(counts.values()) > 0)


def _count(model: ir.Model, op_type: str) -> int:
    return sum(1 for n in model.graph.all_nodes() if n.op_type == op_type and n.domain in ("", "ai.onnx"))
