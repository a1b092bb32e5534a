"""Merge nodes that compute the same value from the same inputs (onnx-ir's CSE)."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes
import onnx_ir.passes.common as common

from aotforge.passes.base import GraphPass, count_nodes


class EliminateCommonSubexpressionsPass(GraphPass):
    name = "cse"

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        before = count_nodes(model)
        result = common.CommonSubexpressionEliminationPass()(model)
        self.stats = {"merged": before - count_nodes(result.model)}
        return onnx_ir.passes.PassResult(result.model, modified=result.modified)
