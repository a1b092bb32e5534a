"""Tiny ONNX models written with onnx.helper, for tests that need a real model file in milliseconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def relu_add(path: Path, shape: tuple[int, ...] = (1, 8)) -> Path:
    """y = relu(x + c): the smallest model both CPU targets compile in about a second."""
    const = numpy_helper.from_array(np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
        "relu_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[const],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path
