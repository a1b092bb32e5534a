"""ConvTranspose's ``output_shape`` as the pads (and output_padding) it implies (TVM ignores it)."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    attributes,
    shape,
)


class ConvTransposeOutputShape(NodeRule):
    """ConvTranspose's ``output_shape`` as the pads (and output_padding) it implies (TVM ignores it)."""

    report_name, ops = "conv_transpose_output_shape", ("ConvTranspose",)
    shaped = (0, 1)

    def check_node(self, node: ir.Node) -> MatchResult:
        if not attr(node, "output_shape"):
            return MatchResult().fail("no output_shape")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, w = shape(node.inputs[0]), shape(node.inputs[1])
        assert x is not None and w is not None  # checked
        spatial = len(x) - 2
        out = list(attr(node, "output_shape"))[-spatial:]
        strides = list(attr(node, "strides", [1] * spatial))
        dilations = list(attr(node, "dilations", [1] * spatial))
        kernel = list(attr(node, "kernel_shape", list(w[2:])))
        extra = list(attr(node, "output_padding", [0] * spatial))
        upper = attr(node, "auto_pad", "NOTSET") != "SAME_LOWER"
        begin, end, padding = [], [], []
        for i in range(spatial):
            total = strides[i] * (x[2 + i] - 1) + extra[i] + ((kernel[i] - 1) * dilations[i] + 1) - out[i]
            short = max(0, -total)  # an output larger than the kernel reaches: the rest is output_padding
            total = max(0, total)
            first = total // 2 if upper else total - total // 2
            begin.append(first)
            end.append(total - first)
            padding.append(extra[i] + short)
        keep = attributes(node, "output_shape", "pads", "auto_pad", "output_padding")
        return op.ConvTranspose(*node.inputs, **keep, pads=begin + end, output_padding=padding)
