"""Pattern fusions through onnxscript's rewriter: canonical ONNX ops, or ORT contrib ops on request.

``contrib_ops=False`` (the default, safe for every target) applies onnxscript's default rules
(transpose / reshape / cast simplification, no-op removal), LayerNormalization fusion (opset
17+) and MatMul+Add -> Gemm where the MatMul is 2-D. ``contrib_ops=True`` runs
``onnxscript.rewriter.ort_fusions.optimize_for_ort`` instead, which rewrites to com.microsoft
ops (SkipLayerNormalization, Attention, FastGelu, ...) only ONNX Runtime runs; targets that
cannot run them refuse the ``fuse-ort`` pass at planning time.
"""

from __future__ import annotations

import collections
import dataclasses

import onnx_ir as ir
import onnx_ir.passes
from onnxscript import rewriter
from onnxscript.rewriter import RewriteRuleSet
from onnxscript.rewriter.rules.common import matmul_add_to_gemm_rule
from onnxscript.rewriter.rules.fusion._layer_norm import layer_normalization_rules

from aotforge.passes.base import GraphPass


@dataclasses.dataclass(frozen=True)
class FusePatternsParams:
    #: Rewrite to ONNX Runtime's com.microsoft contrib ops (only the onnxruntime target runs them).
    contrib_ops: bool = False
    #: Fuse MatMul+Add into Gemm (2-D MatMuls only: Gemm is 2-D).
    gemm: bool = True
    layer_norm: bool = True


class FusePatternsPass(GraphPass):
    name = "fuse"
    Params = FusePatternsParams
    #: Fused kernels reorder float arithmetic (and FastGelu approximates erf): max abs drift.
    tolerance = 1e-3

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        before = op_histogram(model)
        counts = self._canonical(model)
        if self.params.contrib_ops:
            from onnxscript.rewriter.ort_fusions import optimize_for_ort

            _, fusions = optimize_for_ort(model)
            counts.update({f"ort_{k}": int(v) for k, v in fusions.items() if v})
        after = op_histogram(model)
        changed = {op: after.get(op, 0) - before.get(op, 0) for op in set(before) | set(after)}
        self.stats = {"fused": counts, "op_delta": {k: v for k, v in sorted(changed.items()) if v}}
        return onnx_ir.passes.PassResult(model, modified=before != after)

    def _canonical(self, model: ir.Model) -> dict[str, int]:
        counts: dict[str, int] = {}
        opset = model.opset_imports.get("", 0)
        if self.params.layer_norm and opset >= 17:  # LayerNormalization exists from opset 17
            counts["layer_norm"] = RewriteRuleSet(layer_normalization_rules).apply_to_model(model)
        if self.params.gemm:
            counts["matmul_add_gemm"] = RewriteRuleSet([matmul_add_to_gemm_rule]).apply_to_model(model)
        nodes = sum(1 for _ in model.graph.all_nodes())
        rewriter.rewrite(model)  # default rules: transpose/reshape/cast simplification, no-ops
        counts["basic_rules_nodes_removed"] = nodes - sum(1 for _ in model.graph.all_nodes())
        return {k: v for k, v in counts.items() if v}


@dataclasses.dataclass(frozen=True)
class FuseOrtParams(FusePatternsParams):
    contrib_ops: bool = True


class FuseOrtPass(FusePatternsPass):
    """``fuse`` with ``contrib_ops`` on: its own name so targets can refuse it at planning time."""

    name = "fuse-ort"
    Params = FuseOrtParams


def op_histogram(model: ir.Model) -> dict[str, int]:
    counter = collections.Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in model.graph.all_nodes()
    )
    return dict(counter)


def contrib_domains(model: ir.Model) -> set[str]:
    """Non-standard op domains in the graph (e.g. com.microsoft)."""
    return {n.domain for n in model.graph.all_nodes() if n.domain not in ("", "ai.onnx", "ai.onnx.ml")}
