"""Rewrites of convolution-like ops the importer reads wrongly or lacks."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from aotforge.targets.tvm.importable.rules.base import Graph, attr, make


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


def col2im(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Col2Im with static shapes as a sum of Gathers: each image element adds the columns that land on it.

    A column (kernel offset k, block b) lands at ``b * stride - pad_begin + k * dilation`` per spatial
    dim, if that is inside the image. Every image element gathers at most ``T`` columns (the most
    that overlap anywhere); the missing ones read an appended zero column, so no 0 * inf appears.
    """
    if node.op_type != "Col2Im":
        return None
    x, image, block = g.shapes.get(node.input[0]), g.constants.get(node.input[1]), g.constants.get(node.input[2])
    if x is None or image is None or block is None or len(x) != 3 or node.input[0] not in g.dtypes:
        return None
    sources = _col2im_sources(node, [int(d) for d in image], [int(d) for d in block], x[2])
    if sources is None:
        return None
    n, cb, length = x
    channels = cb // int(np.prod(block))
    columns = cb // channels * length
    taps = max(len(s) for s in sources)
    index = np.full((taps, len(sources)), columns, np.int64)
    for p, found in enumerate(sources):
        index[: len(found), p] = found
    out = node.output[0]
    flat, padded, flat_shape, zeros, out_shape = (
        g.fresh(f"{out}_{k}") for k in ("flat", "padded", "flat_shape", "zeros", "shape")
    )
    shape_name, shape_node = g.constant(flat_shape, np.array([n, channels, columns], np.int64))
    zero_name, zero_node = g.constant(zeros, np.zeros((n, channels, 1), g.np_dtype(node.input[0])))
    image_name, image_node = g.constant(out_shape, np.array([n, channels, *image], np.int64))
    nodes = [
        shape_node, zero_node, image_node,
        make("Reshape", [node.input[0], shape_name], [flat]),
        make("Concat", [flat, zero_name], [padded], axis=2),
    ]  # fmt: skip
    summed = ""
    for t in range(taps):
        idx, idx_node = g.constant(f"{out}_taps{t}", index[t])
        picked = g.fresh(f"{out}_picked{t}")
        nodes += [idx_node, make("Gather", [padded, idx], [picked], axis=2)]
        if summed:
            total = g.fresh(f"{out}_sum{t}")
            nodes.append(make("Add", [summed, picked], [total]))
            summed = total
        else:
            summed = picked
    nodes.append(make("Reshape", [summed, image_name], [out]))
    return nodes


#: More columns than this stay a Col2Im (refused at planning): the index tables are built column by column.
MAX_COL2IM = 1 << 16


def _col2im_sources(node: onnx.NodeProto, image: list[int], block: list[int], length: int) -> list[list[int]] | None:
    """For each image element (row-major), the flat column indices (kernel offset * L + block) adding to it."""
    dims = len(image)
    dilations = list(attr(node, "dilations", [1] * dims))
    pads = list(attr(node, "pads", [0] * 2 * dims))
    strides = list(attr(node, "strides", [1] * dims))
    blocks = [
        (image[i] + pads[i] + pads[dims + i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(dims)
    ]
    if int(np.prod(blocks)) != length or int(np.prod(block)) * length > MAX_COL2IM:
        return None
    sources: list[list[int]] = [[] for _ in range(int(np.prod(image)))]
    for k_flat, k in enumerate(np.ndindex(*block)):
        for b_flat, b in enumerate(np.ndindex(*blocks)):
            at = [b[i] * strides[i] - pads[i] + k[i] * dilations[i] for i in range(dims)]
            if all(0 <= at[i] < image[i] for i in range(dims)):
                sources[int(np.ravel_multi_index(at, image))].append(k_flat * length + b_flat)
    return sources
