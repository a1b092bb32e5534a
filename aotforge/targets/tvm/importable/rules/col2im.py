"""Col2Im with static shapes as a sum of Gathers: each image element adds the columns that land on it."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    const,
    constant,
    np_dtype,
    shape,
)

#: More columns than this stay a Col2Im (refused at planning): the index tables are built column by column.
MAX_COL2IM = 1 << 16


class Col2Im(NodeRule):
    """Col2Im with static shapes as a sum of Gathers: each image element adds the columns that land on it.

    A column (kernel offset k, block b) lands at ``b * stride - pad_begin + k * dilation`` per spatial
    dim, if that is inside the image. Every image element gathers at most ``T`` columns (the most
    that overlap anywhere); the missing ones read an appended zero column, so no 0 * inf appears.
    """

    report_name, ops = "col2im", ("Col2Im",)
    typed, shaped, constants = (0,), (0,), (1, 2)

    def check_node(self, node: ir.Node) -> MatchResult:
        x, image, block = shape(node.inputs[0]), const(node.inputs[1]), const(node.inputs[2])
        if x is None or image is None or block is None or len(x) != 3:
            return MatchResult().fail("input of rank other than 3")
        self.sources = _col2im_sources(node, [int(d) for d in image], [int(d) for d in block], x[2])
        if self.sources is None:
            return MatchResult().fail(f"blocks do not add up, or more than {MAX_COL2IM} columns")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, image, block = shape(node.inputs[0]), const(node.inputs[1]), const(node.inputs[2])
        assert x is not None and image is not None and block is not None and self.sources is not None  # checked
        n, cb, length = x
        channels = cb // int(np.prod(block))
        columns = cb // channels * length
        taps = max(len(s) for s in self.sources)
        index = np.full((taps, len(self.sources)), columns, np.int64)
        for p, found in enumerate(self.sources):
            index[: len(found), p] = found
        flat = op.Reshape(node.inputs[0], constant(op, np.array([n, channels, columns], np.int64)))
        zeros = constant(op, np.zeros((n, channels, 1), np_dtype(node.inputs[0])))
        padded = op.Concat(flat, zeros, axis=2)
        summed = None
        for t in range(taps):
            picked = op.Gather(padded, constant(op, index[t]), axis=2)
            summed = picked if summed is None else op.Add(summed, picked)
        return op.Reshape(summed, constant(op, np.array([n, channels, *image], np.int64)))


def _col2im_sources(node: ir.Node, image: list[int], block: list[int], length: int) -> list[list[int]] | None:
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
