"""Float Resize forms TVM's resize computes wrongly, as per-axis Gathers weighted by constant taps."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    FLOATS,
    MatchResult,
    NodeRule,
    attr,
    const,
    constant,
    dtype,
    input_,
    np_dtype,
    shape,
)

#: Resized axes longer than this stay TVM's resize: the taps come from a dense output x input matrix.
MAX_RESIZE = 4096


class ResizeByTaps(NodeRule):
    """Float Resize forms TVM's resize computes wrongly, as per-axis Gathers weighted by constant taps.

    TVM has no antialias and no half_pixel_symmetric, and takes the coordinate scale as output /
    input size where ONNX uses the given ``scales`` (4 -> 2 at scale 0.6 differs). Resize is separable:
    along each resized axis, output ``o`` is ``sum_k w[o, k] * x[idx[o, k]]``; the weights and indices
    are onnx's reference's own (``_interpolate_1d_along_axis`` on an identity), axis by axis in its order.
    """

    report_name, ops = "resize_by_taps", ("Resize",)

    def check_node(self, node: ir.Node) -> MatchResult:
        if dtype(node.inputs[0]) not in FLOATS:
            return MatchResult().fail("not float")
        self.plan = _resize_plan(node)
        return MatchResult() if self.plan is not None else MatchResult().fail("TVM's resize is right here")

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, kind = node.inputs[0], np_dtype(node.inputs[0])
        rank = len(shape(x))  # type: ignore[arg-type]
        for axis, (weights, index) in self.plan:  # type: ignore[union-attr]
            rank_tail = [1] * (rank - axis - 1)
            terms = []
            for k in range(index.shape[1]):
                picked = op.Gather(x, constant(op, index[:, k].astype(np.int64)), axis=axis)
                if (weights[:, k] == 1).all():
                    terms.append(picked)
                    continue
                terms.append(op.Mul(picked, constant(op, weights[:, k].reshape([-1, *rank_tail]).astype(kind))))
            x = terms[0]
            for term in terms[1:]:
                x = op.Add(x, term)
        return op.Identity(x)


def _resize_plan(node: ir.Node) -> list[tuple[int, tuple[np.ndarray, np.ndarray]]] | None:
    """(axis, (weights [out, taps], indices [out, taps])) per resized axis, or None where TVM is right."""
    from onnx.reference.ops import op_resize

    dims = shape(node.inputs[0])
    inputs = [input_(node, k) for k in range(4)]
    values = [const(v) for v in inputs]
    if dims is None or any(n is not None and v is None for n, v in zip(inputs[1:], values[1:], strict=True)):
        return None
    roi, scales, sizes = (v if v is not None and v.size else None for v in values[1:])
    rank = len(dims)
    axes = [int(a) % rank for a in attr(node, "axes", range(rank))]
    mode = attr(node, "mode", "nearest")
    transform = attr(node, "coordinate_transformation_mode", "half_pixel")
    policy = attr(node, "keep_aspect_ratio_policy", "stretch")
    antialias = bool(attr(node, "antialias", 0))
    if (scales is None) == (sizes is None):
        return None
    full_roi = np.array([0.0] * rank + [1.0] * rank)
    if roi is not None:
        for i, d in enumerate(axes):
            full_roi[d], full_roi[rank + d] = roi[i], roi[len(axes) + i]
    if sizes is not None:
        ratios = {d: int(sizes[i]) / dims[d] for i, d in enumerate(axes)}
        if policy != "stretch":
            scale = (min if policy == "not_larger" else max)(ratios.values())
            ratios = dict.fromkeys(axes, scale)
            out = {d: int(scale * dims[d] + 0.5) for d in axes}
        else:
            out = {d: int(sizes[i]) for i, d in enumerate(axes)}
        wrong = policy != "stretch"
    else:
        assert scales is not None  # one of the two, checked above
        ratios = {d: float(scales[i]) for i, d in enumerate(axes)}
        out = {d: int(ratios[d] * dims[d]) for d in axes}
        wrong = any(out[d] / dims[d] != ratios[d] for d in axes) and mode != "nearest"
    wrong = wrong or antialias or transform == "half_pixel_symmetric"
    if not wrong or any(max(dims[d], out[d]) > MAX_RESIZE or out[d] == 0 for d in axes):
        return None
    coeffs = _coefficients(op_resize, mode, antialias, attr(node, "cubic_coeff_a", -0.75), attr(node, "nearest_mode"))
    plan = []
    for d in axes:
        if ratios[d] == 1.0 and out[d] == dims[d] and full_roi[d] == 0 and full_roi[rank + d] == 1:
            continue
        options = {
            "coordinate_transformation_mode": transform,
            "exclude_outside": bool(attr(node, "exclude_outside", 0)),
        }
        span = [full_roi[d], full_roi[rank + d]]
        matrix = op_resize._interpolate_1d_along_axis(
            np.eye(dims[d]), 0, ratios[d], out[d], coeffs, roi=span, **options
        )
        outside = op_resize._interpolate_1d_along_axis(
            np.zeros((dims[d], 1)), 0, ratios[d], out[d], coeffs, roi=span, extrapolation_value=1.0, **options
        )
        if outside.any():  # tf_crop_and_resize's extrapolation_value: not a weighted sum of the input
            return None
        plan.append((d, _taps(matrix)))
    return plan


def _coefficients(op_resize: Any, mode: str, antialias: bool, a: float, nearest: str | None) -> Any:
    """The reference's coefficient function for ``mode`` (as its ``Resize._run`` picks it)."""
    if mode == "nearest":
        return lambda x, _scale: op_resize._nearest_coeffs(x, mode=nearest or "round_prefer_floor")
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
