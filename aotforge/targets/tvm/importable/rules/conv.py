"""Rewrites of convolution-like ops the importer reads wrongly or lacks."""

from __future__ import annotations

import onnx
from onnx import helper

from aotforge.targets.tvm.importable.rules.base import Graph, attr


def conv_transpose_output_shape(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """ConvTranspose's ``output_shape`` as the pads (and output_padding) it implies (TVM ignores it)."""
    if node.op_type != "ConvTranspose":
        return None
    output_shape = attr(node, "output_shape")
    x, w = g.shapes.get(node.input[0]), g.shapes.get(node.input[1])
    if not output_shape or x is None or w is None:
        return None
    spatial = len(x) - 2
    out = list(output_shape)[-spatial:]
    strides = list(attr(node, "strides", [1] * spatial))
    dilations = list(attr(node, "dilations", [1] * spatial))
    kernel = list(attr(node, "kernel_shape", list(w[2:])))
    extra = list(attr(node, "output_padding", [0] * spatial))
    upper = attr(node, "auto_pad", b"NOTSET") != b"SAME_LOWER"
    begin, end, padding = [], [], []
    for i in range(spatial):
        total = strides[i] * (x[2 + i] - 1) + extra[i] + ((kernel[i] - 1) * dilations[i] + 1) - out[i]
        short = max(0, -total)  # an output larger than the kernel reaches: the rest is output_padding
        total = max(0, total)
        first = total // 2 if upper else total - total // 2
        begin.append(first)
        end.append(total - first)
        padding.append(extra[i] + short)
    keep = [a for a in node.attribute if a.name not in ("output_shape", "pads", "auto_pad", "output_padding")]
    new = helper.make_node("ConvTranspose", list(node.input), list(node.output), name=node.name)
    new.attribute.extend(keep)
    new.attribute.extend([helper.make_attribute("pads", begin + end), helper.make_attribute("output_padding", padding)])
    return [new]
