"""What every import step is: an onnx-ir in-place pass (``core/graph_pass.py``'s contract), its stats its report."""

from __future__ import annotations

from typing import Any, ClassVar

import onnx_ir as ir
import onnx_ir.passes.common

from aotforge.core.graph_pass import GraphPass


class ImportStep(GraphPass):
    """One step of :func:`~aotforge.targets.tvm.importable.prepare`: ``name`` is its key in the report."""

    #: Fold (onnxscript's optimizer) after the step changed the graph: its bodies compute shapes from shapes.
    folds: ClassVar[bool] = True
    #: A step that breaks leaves the graph as it was before it, and the report says why.
    may_fail: ClassVar[bool] = True

    def report(self) -> Any:
        return dict(self.stats)


def copy_of(model: ir.Model) -> ir.Model:
    """A copy of ``model`` the steps may change without changing ``model`` (tensors still shared, read only).

    ``Model.clone`` shares each value's type object, and setting a value's ``dtype`` changes that object
    in place: every value of the copy gets a type of its own."""
    copy = model.clone()
    graph = copy.graph
    for value in [*graph.inputs, *graph.initializers.values(), *(v for n in graph.all_nodes() for v in n.outputs)]:
        if isinstance(value.type, ir.TensorType):
            value.type = ir.TensorType(value.type.dtype)
    return copy


def fold(model: ir.Model) -> None:
    """Constant folding and shape inference on the IR (onnxscript's optimizer)."""
    from onnxscript.optimizer import optimize_ir

    optimize_ir(model, onnx_shape_inference=True)


def infer_types(model: ir.Model) -> None:
    """Types and shapes onto every value of ``model`` (onnx's shape inference, with data propagation)."""
    onnx_ir.passes.common.ShapeInferencePass(strict_mode=False, data_prop=True)(model)


def static_shape(value: ir.Value) -> tuple[int, ...] | None:
    shape = value.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


def opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
