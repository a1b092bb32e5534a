"""Small models built in code for the numerics-changing pass tests, and an ONNX Runtime harness."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from aotforge.passes.manager import check_model


def _init(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def mlp(hidden: int = 64, seed: int = 0) -> ir.Model:
    """x[4,32] -> MatMul -> Add -> Relu -> LayerNorm -> Gemm -> Softmax -> y[4,16]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w1", (32, hidden), rng),
        _init("b1", (hidden,), rng),
        numpy_helper.from_array(np.ones(hidden, np.float32), "ln_scale"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "ln_bias"),
        _init("w2", (hidden, 16), rng),
        _init("b2", (16,), rng),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="bias1"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu"),
        helper.make_node("LayerNormalization", ["h3", "ln_scale", "ln_bias"], ["h4"], name="ln", axis=-1),
        helper.make_node("Gemm", ["h4", "w2", "b2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        inits,
    )
    return _finish(graph)


def cnn(channels: int = 8, seed: int = 0) -> ir.Model:
    """x[1,4,8,8] -> Conv -> Relu -> Conv -> GlobalAveragePool -> Flatten -> MatMul -> y[1,10]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("c1_w", (channels, 4, 3, 3), rng),
        _init("c1_b", (channels,), rng),
        _init("c2_w", (channels, channels, 3, 3), rng),
        _init("fc_w", (channels, 10), rng),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["a1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["a2"], name="relu1"),
        helper.make_node("Conv", ["a2", "c2_w"], ["a3"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["a3"], ["a4"], name="gap"),
        helper.make_node("Flatten", ["a4"], ["a5"], name="flatten"),
        helper.make_node("MatMul", ["a5", "fc_w"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return _finish(graph)


def elementwise() -> ir.Model:
    """y = Softmax(x) * x: nothing to quantize, prune or (with Softmax kept) much to convert."""
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=-1),
        helper.make_node("Mul", ["s", "x"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    return _finish(graph)


def _finish(graph: onnx.GraphProto) -> ir.Model:
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    proto = onnx.shape_inference.infer_shapes(proto)
    onnx.checker.check_model(proto)
    return ir.serde.deserialize_model(proto)


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Check ``model`` with onnx.checker and run it on ONNX Runtime's CPU provider."""
    check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feeds)]


def feeds_for(model: ir.Model, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.inputs:
        assert value.name is not None and value.shape is not None
        feeds[value.name] = rng.standard_normal(value.shape.numpy()).astype(np.float32)
    return feeds


#: The rel L2 an int8 rewrite of these models (two quantized layers on the output's path) may cost. int8 rounds a
#: tensor to steps of 1/127 of its largest magnitude: for roughly normal values (largest ~4 standard deviations) an
#: error of 4 / 127 / sqrt(12), ~0.9% of the tensor's RMS. Two layers round four tensors (weights and inputs); their
#: errors taken as adding up (the worst case), with calibrated ranges up to half again wider than the data's.
INT8_REL_L2 = 4 * (4 / 127 / math.sqrt(12)) * 1.5


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    expected = expected.astype(np.float64)
    norm = float(np.linalg.norm(expected))
    return float(np.linalg.norm(actual.astype(np.float64) - expected)) / max(norm, 1e-12)


def conv_bn(channels: int = 8, seed: int = 0) -> ir.Model:
    """x[1,4,8,8] -> Conv -> BatchNormalization -> Relu -> y: what many exported CNNs still carry."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("c_w", (channels, 4, 3, 3), rng),
        _init("c_b", (channels,), rng),
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(channels)).astype(np.float32), "bn_scale"),
        _init("bn_bias", (channels,), rng),
        _init("bn_mean", (channels,), rng),
        numpy_helper.from_array((0.5 + rng.random(channels)).astype(np.float32), "bn_var"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "c_w", "c_b"], ["a1"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["a1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["a2"], name="bn"),
        helper.make_node("Relu", ["a2"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        inits,
    )
    return _finish(graph)


def decomposed_layer_norm(hidden: int = 16, residual: bool = False) -> ir.Model:
    """x[2,8,H] (+ r, the residual) -> LayerNorm written out as ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        _init("gamma", (hidden,), rng),
        _init("beta", (hidden,), rng),
    ]
    names = ["a", "r"] if residual else ["x"]
    nodes = [helper.make_node("Add", ["a", "r"], ["x"])] if residual else []
    nodes += [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "decomposed_ln",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8, hidden]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, hidden])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 8
    proto = onnx.shape_inference.infer_shapes(proto)
    onnx.checker.check_model(proto)
    return ir.serde.deserialize_model(proto)
