"""What a legalize rule sees of the graph, and the helpers the rules share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


@dataclasses.dataclass
class Graph:
    """What a rule may look at: constants by name, static shapes and element types by name."""

    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, int]
    names: set[str]
    #: The model's ai.onnx opset: where ``axes`` is an attribute or an input.
    opset: int = 22

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def constant(self, base: str, value: np.ndarray) -> tuple[str, onnx.NodeProto]:
        name = self.fresh(base)
        return name, helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    def axes_op(
        self, op: str, inputs: list[str], outputs: list[str], axes: list[int], **attrs: Any
    ) -> list[onnx.NodeProto]:
        """``op`` (Unsqueeze, Squeeze or a Reduce*) over ``axes``, as an input or an attribute as the opset has it."""
        as_input = self.opset >= (18 if op.startswith("Reduce") and op != "ReduceSum" else 13)
        if not as_input:
            return [make(op, inputs, outputs, axes=axes, **attrs)]
        name, const = self.constant(f"{outputs[0]}_axes", np.array(axes, np.int64))
        return [const, make(op, [*inputs, name], outputs, **attrs)]

    def np_dtype(self, name: str) -> Any:
        return helper.tensor_dtype_to_np_dtype(self.dtypes[name])


Rule = Callable[[onnx.NodeProto, Graph], "list[onnx.NodeProto] | None"]


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def make(op: str, inputs: list[str], outputs: list[str], **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, **attrs)


def through_dtype(op: onnx.NodeProto, g: Graph, dtype: int, back: int) -> list[onnx.NodeProto]:
    """``op`` computed on its first input cast to ``dtype``, its first output cast back to ``back``."""
    x, y = g.fresh(op.input[0] + "_as"), g.fresh(op.output[0] + "_as")
    inner = onnx.NodeProto()
    inner.CopyFrom(op)
    inner.input[0], inner.output[0] = x, y
    return [make("Cast", [op.input[0]], [x], to=dtype), inner, make("Cast", [y], [op.output[0]], to=back)]
