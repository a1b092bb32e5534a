"""The weight initializers that pruning passes work on, with their input- and output-channel axes."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

WEIGHT_OPS = ("MatMul", "Gemm", "Conv")


@dataclasses.dataclass(frozen=True)
class Weight:
    node: ir.Node
    value: ir.Value
    #: the reduction (input-channel) axis and the output-channel axis of the weight.
    in_axis: int
    out_axis: int

    def array(self) -> np.ndarray:
        assert self.value.const_value is not None
        return self.value.const_value.numpy()

    def replace(self, array: np.ndarray) -> None:
        self.value.const_value = ir.Tensor(array, name=self.value.name)

    def record(self, array: np.ndarray) -> dict[str, object]:
        """Per-layer stats: node, weight, shape, sparsity, output channels."""
        return {
            "node": self.node.name,
            "weight": self.value.name,
            "shape": list(array.shape),
            "sparsity": round(float(np.mean(array == 0)), 4),
            "out_channels": int(array.shape[self.out_axis]),
        }


def prunable_weights(model: ir.Model, op_types: tuple[str, ...] = WEIGHT_OPS) -> list[Weight]:
    """Float weight initializers of ``op_types`` nodes in the main graph, each once."""
    found: dict[ir.Value, Weight] = {}
    for node in model.graph:
        if node.op_type not in op_types or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        value = node.inputs[1]
        if value is None or value.name not in model.graph.initializers or value.const_value is None:
            continue
        if value.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE):
            continue
        rank = len(value.const_value.shape)
        axes = _axes(node, rank)
        if axes is not None and value not in found:
            found[value] = Weight(node, value, *axes)
    return list(found.values())


def _axes(node: ir.Node, rank: int) -> tuple[int, int] | None:
    if node.op_type == "MatMul":
        return (rank - 2, rank - 1) if rank >= 2 else None
    if node.op_type == "Gemm":
        return (1, 0) if node.attributes.get_int("transB", 0) else (0, 1)
    return (1, 0) if rank >= 3 else None
