"""Remove nodes, functions, opsets and initializers that no graph output depends on."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes
import onnx_ir.passes.common as common

from aotforge.passes.base import GraphPass


class EliminateDeadCodePass(GraphPass):
    name = "dce"

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        initializers = len(model.graph.initializers)
        pipeline = onnx_ir.passes.Sequential(
            common.RemoveUnusedNodesPass(),
            common.RemoveUnusedFunctionsPass(),
            common.RemoveUnusedOpsetsPass(),
        )
        result = pipeline(model)
        self.stats = {"initializers_removed": initializers - len(result.model.graph.initializers)}
        return onnx_ir.passes.PassResult(result.model, modified=result.modified)
