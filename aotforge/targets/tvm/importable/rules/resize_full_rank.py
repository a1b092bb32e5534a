"""Resize with ``axes`` or a keep_aspect_ratio_policy, as a Resize of every axis (TVM reads neither)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import (
    MatchResult,
    NodeRule,
    attr,
    attributes,
    const,
    constant,
    input_,
    shape,
)


class ResizeFullRank(NodeRule):
    """Resize with ``axes`` or a keep_aspect_ratio_policy, as a Resize of every axis (TVM reads neither).

    scales / sizes / roi over ``axes`` become full-rank constants (1, the input's size, the whole
    range elsewhere); not_larger / not_smaller become the sizes they pick, where those sizes have
    the ratio the policy's one scale gives (else the coordinates would differ: left alone).
    """

    report_name, ops = "resize_full_rank", ("Resize",)

    def check_node(self, node: ir.Node) -> MatchResult:
        axes_attr, policy = attr(node, "axes"), attr(node, "keep_aspect_ratio_policy", "stretch")
        if len(node.inputs) < 3 or (axes_attr is None and policy == "stretch"):
            return MatchResult().fail("neither axes nor a keep_aspect_ratio_policy")
        given = shape(node.inputs[0])
        if given is None:
            return MatchResult().fail("input shape unknown")
        rank = len(given)
        axes = [int(a) % rank for a in (axes_attr if axes_attr is not None else range(rank))]
        named = [input_(node, k) for k in (1, 2, 3)]
        roi, scales, sizes = (const(v) for v in named)
        if any(v is not None and c is None for v, c in zip(named, (roi, scales, sizes), strict=True)):
            return MatchResult().fail("roi / scales / sizes not constant")
        scales = None if scales is not None and scales.size == 0 else scales
        sizes = None if sizes is not None and sizes.size == 0 else sizes
        if (scales is None) == (sizes is None):
            return MatchResult().fail("neither or both of scales and sizes")
        self.roi = None
        if roi is not None and roi.size:
            self.roi = np.concatenate([np.zeros(rank), np.ones(rank)]).astype(roi.dtype)
            for i, d in enumerate(axes):
                self.roi[d], self.roi[rank + d] = roi[i], roi[len(axes) + i]
        self.scales = self.sizes = None
        if scales is not None:
            if policy != "stretch":
                return MatchResult().fail("a policy with scales")
            self.scales = np.ones(rank, scales.dtype)
            self.scales[axes] = scales.reshape(-1)
            return MatchResult()
        full_sizes = np.array(given, np.int64)
        full_sizes[axes] = sizes.reshape(-1)  # type: ignore[union-attr]
        if policy != "stretch":
            ratios = [full_sizes[d] / given[d] for d in axes]
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            full_sizes = np.array([int(scale * given[d] + 0.5) if d in axes else given[d] for d in range(rank)])
            if any(full_sizes[d] / given[d] != scale for d in axes):
                return MatchResult().fail("the policy's sizes lose its ratio")
        self.sizes = full_sizes.astype(np.int64)
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        inputs: list[Any] = [node.inputs[0], None, None, None]
        if self.roi is not None:
            inputs[1] = constant(op, self.roi)
        if self.scales is not None:
            inputs[2] = constant(op, self.scales)
        else:
            inputs[3] = constant(op, self.sizes)
        while inputs and inputs[-1] is None:
            inputs.pop()
        return op.Resize(*inputs, **attributes(node, "axes", "keep_aspect_ratio_policy"))
