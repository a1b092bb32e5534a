"""Constant folding through onnxscript's optimizer (it knows every ONNX op's reference impl)."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import onnx_ir.passes
from onnxscript.optimizer import fold_constants_ir

from aotforge.passes.base import GraphPass


@dataclasses.dataclass(frozen=True)
class FoldConstantsParams:
    #: Tensors above these element counts are left alone, so weights are not duplicated.
    input_size_limit: int = 8192
    output_size_limit: int = 262144


class FoldConstantsPass(GraphPass):
    name = "fold"
    Params = FoldConstantsParams

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        result = fold_constants_ir(
            model,
            onnx_shape_inference=False,
            input_size_limit=self.params.input_size_limit,
            output_size_limit=self.params.output_size_limit,
        )
        self.stats = {"folded": len(result.symbolic_value_map)}
        return onnx_ir.passes.PassResult(model, modified=bool(result.modified))
