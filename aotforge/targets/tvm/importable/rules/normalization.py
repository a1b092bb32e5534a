"""BatchNormalization in training mode (batch statistics and running-statistics outputs) as primitives.

TVM's importer reads training_mode=1 but returns the given running mean / var unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx

from aotforge.targets.tvm.importable.rules.base import Graph, attr, make


def batch_norm_training(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """BatchNormalization-14/15 with training_mode=1, as onnx's reference computes it: the batch mean and
    (biased) variance over every axis but 1 normalize x; the running outputs are
    ``given * momentum + batch * (1 - momentum)``."""
    if node.op_type != "BatchNormalization" or not attr(node, "training_mode", 0):
        return None
    shape = g.shapes.get(node.input[0])
    if shape is None or len(shape) < 2 or node.input[0] not in g.dtypes:
        return None
    dtype = g.np_dtype(node.input[0])
    x, scale, bias, mean, var = node.input[:5]
    out = node.output[0]
    axes = [0, *range(2, len(shape))]
    channel = [-1] + [1] * (len(shape) - 2)

    def const(base: str, value: np.ndarray) -> str:
        name, c = g.constant(f"{out}_{base}", value)
        nodes.append(c)
        return name

    def op(name: str, *inputs: str, **attrs: object) -> str:
        y = g.fresh(f"{out}_{name.lower()}")
        nodes.append(make(name, list(inputs), [y], **attrs))
        return y

    nodes: list[onnx.NodeProto] = []
    momentum = float(attr(node, "momentum", 0.9))
    batch_mean = g.fresh(f"{out}_mean")
    nodes += g.axes_op("ReduceMean", [x], [batch_mean], axes, keepdims=1)
    centered = op("Sub", x, batch_mean)
    batch_var = g.fresh(f"{out}_var")
    nodes += g.axes_op("ReduceMean", [op("Mul", centered, centered)], [batch_var], axes, keepdims=1)
    std = op("Sqrt", op("Add", batch_var, const("eps", np.array(attr(node, "epsilon", 1e-5), dtype))))
    shape_c = const("channel", np.array(channel, np.int64))
    scaled = op("Mul", op("Div", centered, std), op("Reshape", scale, shape_c))
    nodes.append(make("Add", [scaled, op("Reshape", bias, shape_c)], [out]))
    keep, take = const("momentum", np.array(momentum, dtype)), const("rest", np.array(1 - momentum, dtype))
    flat = const("flat", np.array([-1], np.int64))
    for given, batch, result in ((mean, batch_mean, 1), (var, batch_var, 2)):
        if len(node.output) > result and node.output[result]:
            running = op("Add", op("Mul", given, keep), op("Mul", op("Reshape", batch, flat), take))
            nodes.append(make("Identity", [running], [node.output[result]]))
    return nodes
