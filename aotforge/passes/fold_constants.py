"""Constant folding through onnxscript's optimizer (it knows every ONNX op's reference impl)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

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
        with _hidden(model, [n for n in model.graph.all_nodes() if _mishandled(n)]):
            result = fold_constants_ir(
                model,
                onnx_shape_inference=False,
                input_size_limit=self.params.input_size_limit,
                output_size_limit=self.params.output_size_limit,
            )
        self.stats = {"folded": len(result.symbolic_value_map)}
        return onnx_ir.passes.PassResult(model, modified=bool(result.modified))


#: A domain the model does not import: the optimizer skips nodes of such domains.
_HIDDEN_DOMAIN = "aotforge.hidden"


def _mishandled(node: ir.Node) -> bool:
    """Nodes onnxscript 0.7's per-op rules get wrong: CastLike -> Cast drops ``saturate=0`` (float8
    casts then saturate instead of giving NaN); SplitToSequence with a ``split`` input that is not a
    constant raises inside the rule."""
    if node.domain != "":
        return False
    if node.op_type == "CastLike":
        return node.attributes.get_int("saturate", 1) == 0
    if node.op_type == "SplitToSequence":
        split = node.inputs[1] if len(node.inputs) > 1 else None
        return split is not None and split.const_value is None
    return False


@contextlib.contextmanager
def _hidden(model: ir.Model, nodes: list[ir.Node]) -> Iterator[None]:
    """``nodes`` moved to a domain the optimizer does not know for the duration, then put back."""
    for node in nodes:
        node.domain = _HIDDEN_DOMAIN
    try:
        yield
    finally:
        for node in nodes:
            node.domain = ""
        model.opset_imports.pop(_HIDDEN_DOMAIN, None)
