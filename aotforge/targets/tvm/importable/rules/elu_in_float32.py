"""Elu / Celu of float16 / bfloat16 / double through float32 (the importer's constants are float32)."""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    dtype,
    through_dtype,
)

DOUBLE = onnx.TensorProto.DOUBLE


class EluInFloat32(NodeRule):
    """Elu / Celu of float16 / bfloat16 / double through float32 (the importer's constants are float32)."""

    report_name, ops = "elu_in_float32", ("Elu", "Celu")

    def check_node(self, node: ir.Node) -> MatchResult:
        if dtype(node.inputs[0]) not in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, DOUBLE):
            return MatchResult().fail("not float16 / bfloat16 / double")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return through_dtype(op, node, onnx.TensorProto.FLOAT, dtype(node.inputs[0]))  # type: ignore[arg-type]
