"""Bind the input dims to a bucket's sizes, then fold: the importer takes many shape inputs only as constants."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx_ir as ir
import onnx_ir.passes

from aotforge.targets.tvm.importable.base import ImportStep, fold


class BindShapesPass(ImportStep):
    """Every named input's shape set to ``shapes[name]`` (a str keeps a dim symbolic), then onnxscript's
    optimizer: Shape, Size, Range, ConstantOfShape and shape arithmetic become constants."""

    name = "bind_shapes"
    folds = False  # it folds itself, changed or not
    may_fail = False

    def __init__(self, shapes: Mapping[str, list[Any]]) -> None:
        super().__init__()
        self.shapes = shapes

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        for value in model.graph.inputs:
            if value.name is not None and value.name in self.shapes:
                value.shape = ir.Shape(self.shapes[value.name])
        fold(model)
        return onnx_ir.passes.PassResult(model, modified=True)

    def report(self) -> Any:
        return None


def bind_and_fold(model: ir.Model, shapes: Mapping[str, list[Any]]) -> Any:
    """``model`` (changed in place) with ``shapes`` bound and folded, as the proto the importer reads."""
    BindShapesPass(shapes)(model)
    return ir.serde.serialize_model(model)
