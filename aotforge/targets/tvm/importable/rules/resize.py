"""Rewrites of Resize forms TVM's resize does not read."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from aotforge.targets.tvm.importable.rules.base import Graph, attr


def resize_full_rank(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Resize with ``axes`` or a keep_aspect_ratio_policy, as a Resize of every axis (TVM reads neither).

    scales / sizes / roi over ``axes`` become full-rank constants (1, the input's size, the whole
    range elsewhere); not_larger / not_smaller become the sizes they pick, where those sizes have
    the ratio the policy's one scale gives (else the coordinates would differ: left alone).
    """
    if node.op_type != "Resize" or len(node.input) < 3:
        return None
    axes_attr, policy = attr(node, "axes"), attr(node, "keep_aspect_ratio_policy", b"stretch")
    if axes_attr is None and policy == b"stretch":
        return None
    shape = g.shapes.get(node.input[0])
    if shape is None:
        return None
    rank = len(shape)
    axes = [int(a) % rank for a in (axes_attr if axes_attr is not None else range(rank))]
    roi_name = node.input[1] if len(node.input) > 1 else ""
    scales_name = node.input[2] if len(node.input) > 2 else ""
    sizes_name = node.input[3] if len(node.input) > 3 else ""
    roi = g.constants.get(roi_name) if roi_name else None
    scales = g.constants.get(scales_name) if scales_name else None
    sizes = g.constants.get(sizes_name) if sizes_name else None
    if (roi_name and roi is None) or (scales_name and scales is None) or (sizes_name and sizes is None):
        return None
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        return None
    new_inputs = [node.input[0], "", "", ""]
    nodes: list[onnx.NodeProto] = []
    if roi is not None and roi.size:
        full = np.concatenate([np.zeros(rank), np.ones(rank)]).astype(roi.dtype)
        for i, d in enumerate(axes):
            full[d], full[rank + d] = roi[i], roi[len(axes) + i]
        new_inputs[1], const = g.constant("resize_roi", full)
        nodes.append(const)
    if scales is not None:
        if policy != b"stretch":
            return None
        full_scales = np.ones(rank, scales.dtype)
        full_scales[axes] = scales.reshape(-1)
        new_inputs[2], const = g.constant("resize_scales", full_scales)
    else:
        assert sizes is not None
        full_sizes = np.array(shape, np.int64)
        full_sizes[axes] = sizes.reshape(-1)
        if policy != b"stretch":
            ratios = [full_sizes[d] / shape[d] for d in axes]
            scale = min(ratios) if policy == b"not_larger" else max(ratios)
            full_sizes = np.array([int(scale * shape[d] + 0.5) if d in axes else shape[d] for d in range(rank)])
            if any(full_sizes[d] / shape[d] != scale for d in axes):
                return None
        new_inputs[3], const = g.constant("resize_sizes", full_sizes.astype(np.int64))
    nodes.append(const)
    while new_inputs and not new_inputs[-1]:
        new_inputs.pop()
    resize = helper.make_node("Resize", new_inputs, list(node.output), name=node.name)
    resize.attribute.extend(a for a in node.attribute if a.name not in ("axes", "keep_aspect_ratio_policy"))
    return [*nodes, resize]
