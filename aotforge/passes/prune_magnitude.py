"""Unstructured magnitude pruning: each weight loses its smallest-magnitude entries up to a target ratio.

Runtimes only gain from this with sparse kernels or compression; it also measures how much
of a model's weight mass matters. Layers already at or above the ratio are left as they are.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import onnx_ir.passes

from aotforge.core.errors import OptionsError
from aotforge.passes.base import GraphPass
from aotforge.passes.prunable_weights import WEIGHT_OPS, prunable_weights


@dataclasses.dataclass(frozen=True)
class PruneMagnitudeParams:
    #: Fraction of each weight's entries set to zero.
    sparsity: float = 0.5
    op_types: tuple[str, ...] = WEIGHT_OPS
    nodes_to_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise OptionsError(f"pass prune: sparsity {self.sparsity} must lie in [0, 1)")


class PruneMagnitudePass(GraphPass):
    name = "prune"
    Params = PruneMagnitudeParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        layers, pruned = [], 0
        for weight in prunable_weights(model, self.params.op_types):
            if weight.node.name in self.params.nodes_to_exclude:
                continue
            array = weight.array()
            new = prune_to(array, self.params.sparsity)
            if new is not None:
                weight.replace(new)
                pruned += 1
            layers.append(weight.record(array if new is None else new))
        total = sum(np.prod(r["shape"]) for r in layers)  # type: ignore[call-overload]
        zeros = sum(r["sparsity"] * np.prod(r["shape"]) for r in layers)  # type: ignore[call-overload, operator]
        self.stats = {
            "layers_pruned": pruned,
            "layers": layers,
            "sparsity": round(float(zeros / total), 4) if total else 0.0,
        }
        return onnx_ir.passes.PassResult(model, modified=pruned > 0)


def prune_to(array: np.ndarray, sparsity: float) -> np.ndarray | None:
    """``array`` with its ``sparsity`` fraction of smallest magnitudes zeroed; None if already that sparse."""
    count = int(sparsity * array.size)
    if int(np.count_nonzero(array == 0)) >= count:
        return None
    flat = array.reshape(-1).copy()
    flat[np.argsort(np.abs(flat), kind="stable")[:count]] = 0
    return flat.reshape(array.shape)
