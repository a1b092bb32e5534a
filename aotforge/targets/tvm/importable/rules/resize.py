"""Rewrites of Resize forms TVM's resize does not read."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from aotforge.targets.tvm.importable.rules.base import FLOATS, Graph, attr, make


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


def resize_by_taps(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Float Resize forms TVM's resize computes wrongly, as per-axis Gathers weighted by constant taps.

    TVM has no antialias and no half_pixel_symmetric, and takes the coordinate scale as output /
    input size where ONNX uses the given ``scales`` (4 -> 2 at scale 0.6 differs). Resize is separable:
    along each resized axis, output ``o`` is ``sum_k w[o, k] * x[idx[o, k]]``; the weights and indices
    are onnx's reference's own (``_interpolate_1d_along_axis`` on an identity), axis by axis in its order.
    """
    if node.op_type != "Resize" or node.input[0] not in g.dtypes or g.dtypes[node.input[0]] not in FLOATS:
        return None
    plan = _resize_plan(node, g)
    if plan is None:
        return None
    x, nodes, dtype = node.input[0], [], g.np_dtype(node.input[0])
    shape = list(g.shapes[x])
    for axis, (weights, index) in plan:
        rank_tail = [1] * (len(shape) - axis - 1)
        terms = []
        for k in range(index.shape[1]):
            idx, idx_node = g.constant("resize_idx", index[:, k].astype(np.int64))
            picked = g.fresh(f"{node.output[0]}_a{axis}_t{k}")
            nodes += [idx_node, make("Gather", [x, idx], [picked], axis=axis)]
            if (weights[:, k] == 1).all():
                terms.append(picked)
                continue
            w, w_node = g.constant("resize_w", weights[:, k].reshape([-1, *rank_tail]).astype(dtype))
            terms.append(g.fresh(f"{node.output[0]}_a{axis}_w{k}"))
            nodes += [w_node, make("Mul", [picked, w], [terms[-1]])]
        x = terms[0]
        for term in terms[1:]:
            total = g.fresh(f"{node.output[0]}_a{axis}_sum")
            nodes.append(make("Add", [x, term], [total]))
            x = total
        shape[axis] = len(index)
    return [*nodes, make("Identity", [x], [node.output[0]])]


#: Resized axes longer than this stay TVM's resize: the taps come from a dense output x input matrix.
MAX_RESIZE = 4096


def _resize_plan(node: onnx.NodeProto, g: Graph) -> list[tuple[int, tuple[np.ndarray, np.ndarray]]] | None:
    """(axis, (weights [out, taps], indices [out, taps])) per resized axis, or None where TVM is right."""
    from onnx.reference.ops import op_resize

    shape = g.shapes.get(node.input[0])
    inputs = [*node.input, "", "", ""][:4]
    values = [g.constants.get(n) if n else None for n in inputs]
    if shape is None or any(n and v is None for n, v in zip(inputs[1:], values[1:], strict=True)):
        return None
    roi, scales, sizes = (v if v is not None and v.size else None for v in values[1:])
    rank = len(shape)
    axes = [int(a) % rank for a in attr(node, "axes", range(rank))]
    mode = attr(node, "mode", b"nearest").decode()
    transform = attr(node, "coordinate_transformation_mode", b"half_pixel").decode()
    policy = attr(node, "keep_aspect_ratio_policy", b"stretch").decode()
    antialias = bool(attr(node, "antialias", 0))
    if (scales is None) == (sizes is None):
        return None
    full_roi = np.array([0.0] * rank + [1.0] * rank)
    if roi is not None:
        for i, d in enumerate(axes):
            full_roi[d], full_roi[rank + d] = roi[i], roi[len(axes) + i]
    if sizes is not None:
        ratios = {d: int(sizes[i]) / shape[d] for i, d in enumerate(axes)}
        if policy != "stretch":
            scale = (min if policy == "not_larger" else max)(ratios.values())
            ratios = dict.fromkeys(axes, scale)
            out = {d: int(scale * shape[d] + 0.5) for d in axes}
        else:
            out = {d: int(sizes[i]) for i, d in enumerate(axes)}
        wrong = policy != "stretch"
    else:
        assert scales is not None  # one of the two, checked above
        ratios = {d: float(scales[i]) for i, d in enumerate(axes)}
        out = {d: int(ratios[d] * shape[d]) for d in axes}
        wrong = any(out[d] / shape[d] != ratios[d] for d in axes) and mode != "nearest"
    wrong = wrong or antialias or transform == "half_pixel_symmetric"
    if not wrong or any(max(shape[d], out[d]) > MAX_RESIZE or out[d] == 0 for d in axes):
        return None
    coeffs = _coefficients(op_resize, mode, antialias, attr(node, "cubic_coeff_a", -0.75), attr(node, "nearest_mode"))
    plan = []
    for d in axes:
        if ratios[d] == 1.0 and out[d] == shape[d] and full_roi[d] == 0 and full_roi[rank + d] == 1:
            continue
        options = {
            "coordinate_transformation_mode": transform,
            "exclude_outside": bool(attr(node, "exclude_outside", 0)),
        }
        span = [full_roi[d], full_roi[rank + d]]
        matrix = op_resize._interpolate_1d_along_axis(
            np.eye(shape[d]), 0, ratios[d], out[d], coeffs, roi=span, **options
        )
        outside = op_resize._interpolate_1d_along_axis(
            np.zeros((shape[d], 1)), 0, ratios[d], out[d], coeffs, roi=span, extrapolation_value=1.0, **options
        )
        if outside.any():  # tf_crop_and_resize's extrapolation_value: not a weighted sum of the input
            return None
        plan.append((d, _taps(matrix)))
    return plan


def _coefficients(op_resize: Any, mode: str, antialias: bool, a: float, nearest: bytes | None) -> Any:
    """The reference's coefficient function for ``mode`` (as its ``Resize._run`` picks it)."""
    if mode == "nearest":
        return lambda x, _scale: op_resize._nearest_coeffs(x, mode=(nearest or b"round_prefer_floor").decode())
    if mode == "cubic":
        cubic = op_resize._cubic_coeffs_antialias if antialias else op_resize._cubic_coeffs
        return lambda x, scale: cubic(x, scale, A=a)
    return op_resize._linear_coeffs_antialias if antialias else op_resize._linear_coeffs


def _taps(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dense [out, in] weight matrix as (weights, indices) [out, taps]: each row's nonzeros, padded by
    a zero weight on index 0."""
    taps = max(1, int((matrix != 0).sum(axis=1).max()))
    weights, index = np.zeros((len(matrix), taps)), np.zeros((len(matrix), taps), np.int64)
    for o, row in enumerate(matrix):
        (found,) = np.nonzero(row)
        weights[o, : len(found)], index[o, : len(found)] = row[found], found
    return weights, index


def upsample_nearest(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """Upsample (opset 7-9, before Resize existed) nearest by whole constant scales as one Gather per
    scaled axis (each element repeated ``scale`` times, as onnx's reference does)."""
    if node.op_type != "Upsample" or attr(node, "mode", b"nearest") != b"nearest":
        return None
    shape = g.shapes.get(node.input[0])
    scales = g.constants.get(node.input[1]) if len(node.input) > 1 else np.array(attr(node, "scales") or [])
    if shape is None or scales is None or len(scales) != len(shape) or (scales != np.round(scales)).any():
        return None
    x, nodes = node.input[0], []
    for axis, scale in enumerate(int(s) for s in scales):
        if scale == 1:
            continue
        index, index_node = g.constant("upsample_index", np.repeat(np.arange(shape[axis], dtype=np.int64), scale))
        y = g.fresh(f"{node.output[0]}_a{axis}")
        nodes += [index_node, make("Gather", [x, index], [y], axis=axis)]
        x = y
    return [*nodes, make("Identity", [x], [node.output[0]])]
