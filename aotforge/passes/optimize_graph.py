"""onnxscript's optimizer cleanup: folding, inlining, CSE-free rewrites and dead-code removal to a fixed point."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import onnx_ir.passes
from onnxscript.optimizer import optimize_ir

from aotforge.passes.base import GraphPass, count_nodes


@dataclasses.dataclass(frozen=True)
class OptimizeGraphParams:
    num_iterations: int = 2


class OptimizeGraphPass(GraphPass):
    name = "optimize"
    Params = OptimizeGraphParams

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        before = count_nodes(model)
        # onnx shape inference off: it cannot load >2 GB protos and the frontend already ran it.
        optimize_ir(model, num_iterations=self.params.num_iterations, onnx_shape_inference=False)
        return onnx_ir.passes.PassResult(model, modified=count_nodes(model) != before)
