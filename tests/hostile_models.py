"""Malformed ONNX models, written with onnx.helper: the corpus the fault-injection tests build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

_vi = helper.make_tensor_value_info


def _unary(name: str, shape: list[int], elem: int = TensorProto.FLOAT, op: str = "Relu") -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], name, [_vi("x", elem, shape)], [_vi("y", elem, shape)]
    )
    return _model(graph)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _no_outputs() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [_vi("x", TensorProto.FLOAT, [1, 4])], [])
    return _model(graph)


def _nan_source() -> onnx.ModelProto:
    # log of the negative half of the inputs is NaN in the source model itself; NaN - NaN stays NaN
    nodes = [helper.make_node("Log", ["x"], ["l"]), helper.make_node("Sub", ["l", "l"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", TensorProto.FLOAT, [1, 4])], [_vi("y", TensorProto.FLOAT, [1, 4])])
    return _model(graph)


def _long_loop(trips: int = 2**30) -> onnx.ModelProto:
    """A Loop that really runs ``trips`` iterations (y = x + trips): hours in any runtime."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
        ],
        "body",
        [
            _vi("i", TensorProto.INT64, []),
            _vi("cond_in", TensorProto.BOOL, []),
            _vi("acc_in", TensorProto.FLOAT, [1, 4]),
        ],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    nodes = [helper.make_node("Loop", ["trips", "cond"], ["y"], body=body)]
    init = [
        helper.make_tensor("trips", TensorProto.INT64, [], [trips]),
        helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
    ]
    nodes.insert(0, helper.make_node("Identity", ["x"], ["x0"]))
    nodes[1].input.append("x0")
    graph = helper.make_graph(
        nodes, "g", [_vi("x", TensorProto.FLOAT, [1, 4])], [_vi("y", TensorProto.FLOAT, [1, 4])], init
    )
    return _model(graph)


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "dim_2_40": lambda: _unary("g", [1, 2**40]),
    "dim_2_62": lambda: _unary("g", [2**62]),
    "dim_negative": lambda: _unary("g", [1, -3]),
    "dim_zero": lambda: _unary("g", [0, 10]),
    "elem_type_99": lambda: _unary("g", [1, 4], elem=99),
    "no_outputs": _no_outputs,
    "nan_source": _nan_source,
    "loop_2_30": _long_loop,
}


def write(case: str, directory: Path) -> Path:
    path = directory / f"{case}.onnx"
    onnx.save(MODELS[case](), path)
    return path
