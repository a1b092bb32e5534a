"""core.onnx_values: the one place rewrites read constants and register initializers."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aotforge.core.onnx_values import add_initializer, constant_array


def _graph() -> ir.Graph:
    x = ir.Value(name="x", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
    return ir.Graph([x], [], nodes=[], name="g")


def test_a_taken_name_is_shared_or_renamed_never_overwritten() -> None:
    graph = _graph()
    first = add_initializer(graph, "w", np.ones((2, 3), np.float32))
    assert add_initializer(graph, "w", np.zeros(1, np.int64), share=True) is first
    second = add_initializer(graph, "w", np.zeros((4,), np.float16))
    third = add_initializer(graph, "w", np.zeros((1,), np.int8))
    assert (second.name, third.name) == ("w_1", "w_2")
    assert second.dtype == ir.DataType.FLOAT16 and list(second.shape) == [4]
    np.testing.assert_array_equal(constant_array(graph.initializers["w"]), np.ones((2, 3), np.float32))


def test_constant_array_is_none_for_a_computed_value() -> None:
    graph = _graph()
    assert constant_array(graph.inputs[0]) is None
    assert constant_array(None) is None
