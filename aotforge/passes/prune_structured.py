"""2:4 structured magnitude pruning: in every group of four weights along the input channels, two are zeroed.

That is the pattern NVIDIA's sparse tensor cores (and TensorRT's sparse-weights mode) run at up
to twice the math rate. The two smallest magnitudes go. Layers whose reduction axis is not a
multiple of four are left alone; layers with few output channels are pruned but flagged, since
TensorRT's sparse tactics only win at roughly 256 channels and more.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import onnx_ir.passes

from aotforge.passes.base import GraphPass
from aotforge.passes.prunable_weights import WEIGHT_OPS, prunable_weights


@dataclasses.dataclass(frozen=True)
class PruneStructuredParams:
    op_types: tuple[str, ...] = WEIGHT_OPS
    #: Layers with fewer output channels are flagged as too small to profit.
    min_out_channels: int = 256
    nodes_to_exclude: tuple[str, ...] = ()


class PruneStructuredPass(GraphPass):
    name = "sparsity24"
    Params = PruneStructuredParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        layers, skipped, pruned = [], {}, 0
        for weight in prunable_weights(model, self.params.op_types):
            if weight.node.name in self.params.nodes_to_exclude:
                continue
            array = weight.array()
            if array.shape[weight.in_axis] % 4:
                skipped[weight.node.name] = f"input channels {array.shape[weight.in_axis]} not a multiple of 4"
                continue
            new = prune_2_4(array, weight.in_axis)
            if not np.array_equal(new, array):
                weight.replace(new)
                pruned += 1
            record = weight.record(new)
            record["too_small"] = record["out_channels"] < self.params.min_out_channels
            layers.append(record)
        self.stats = {
            "layers_pruned": pruned,
            "layers": layers,
            "skipped": skipped,
            "too_small": [r["node"] for r in layers if r["too_small"]],
        }
        return onnx_ir.passes.PassResult(model, modified=pruned > 0)


def prune_2_4(array: np.ndarray, axis: int) -> np.ndarray:
    """Zero the two smallest-magnitude weights of every four consecutive ones along ``axis``."""
    moved = np.moveaxis(array, axis, -1)
    groups = moved.reshape(*moved.shape[:-1], -1, 4)
    # stable sort: ties (e.g. groups already 2:4) keep the earlier zeros, so re-pruning is a no-op
    smallest = np.argsort(np.abs(groups), axis=-1, kind="stable")[..., :2]
    mask = np.ones(groups.shape, dtype=bool)
    np.put_along_axis(mask, smallest, False, axis=-1)
    pruned = np.where(mask, groups, np.zeros((), groups.dtype)).reshape(moved.shape)
    return np.ascontiguousarray(np.moveaxis(pruned, -1, axis))
