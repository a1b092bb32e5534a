"""BatchNormalization-14/15 with training_mode=1, as onnx's reference computes it: the batch mean and"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import MatchResult, NodeRule, attr, constant, np_dtype, shape


class BatchNormTraining(NodeRule):
    """BatchNormalization-14/15 with training_mode=1, as onnx's reference computes it: the batch mean and
    (biased) variance over every axis but 1 normalize x; the running outputs are
    ``given * momentum + batch * (1 - momentum)``."""

    report_name, ops = "batch_norm_training", ("BatchNormalization",)
    typed, shaped = (0,), (0,)
    outputs = (1, 2, 3)

    def check_node(self, node: ir.Node) -> MatchResult:
        if not attr(node, "training_mode", 0):
            return MatchResult().fail("inference mode: TVM's own")
        if len(shape(node.inputs[0]) or ()) < 2:
            return MatchResult().fail("input of rank < 2")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        x, scale, bias, mean, var = node.inputs[:5]
        rank, kind = len(shape(x)), np_dtype(x)  # type: ignore[arg-type]
        axes = [0, *range(2, rank)]
        channel = constant(op, np.array([-1] + [1] * (rank - 2), np.int64))
        momentum = float(attr(node, "momentum", 0.9))
        batch_mean = self.axes_op(op, "ReduceMean", [x], axes, keepdims=1)
        centered = op.Sub(x, batch_mean)
        batch_var = self.axes_op(op, "ReduceMean", [op.Mul(centered, centered)], axes, keepdims=1)
        std = op.Sqrt(op.Add(batch_var, constant(op, np.array(attr(node, "epsilon", 1e-5), kind))))
        outputs = [op.Add(op.Mul(op.Div(centered, std), op.Reshape(scale, channel)), op.Reshape(bias, channel))]
        keep, take = constant(op, np.array(momentum, kind)), constant(op, np.array(1 - momentum, kind))
        flat = constant(op, np.array([-1], np.int64))
        for given, batch, result in ((mean, batch_mean, 1), (var, batch_var, 2)):
            if len(node.outputs) > result:
                used = node.outputs[result].name
                outputs.append(op.Add(op.Mul(given, keep), op.Mul(op.Reshape(batch, flat), take)) if used else None)
        return outputs if len(outputs) > 1 else outputs[0]
