"""EyeLike with a ``dtype`` other than its input's, as EyeLike then Cast (the importer wants them equal)."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    attributes,
    dtype,
)


class EyeLikeDtype(NodeRule):
    """EyeLike with a ``dtype`` other than its input's, as EyeLike then Cast (the importer wants them equal)."""

    report_name, ops = "eye_like_dtype", ("EyeLike",)

    def check_node(self, node: ir.Node) -> MatchResult:
        wanted, given = attr(node, "dtype"), dtype(node.inputs[0])
        if wanted is None or given is None or wanted == given:
            return MatchResult().fail("no dtype other than the input's")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        return op.Cast(op.EyeLike(node.inputs[0], **attributes(node, "dtype")), to=attr(node, "dtype"))
