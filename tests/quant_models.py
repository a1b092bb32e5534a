"""Small models for the int8-dynamic tests: activations with an outlier channel, a fused Attention block."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SEQ, HIDDEN, HEADS = 8, 32, 2


def outlier_mlp(seed: int = 0) -> ir.Model:
    """x[16,64] -> MatMul(64x48) -> Relu -> MatMul(48x16) -> y; see :func:`outlier_inputs`."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((64, 48)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((48, 16)) * 0.2).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "outlier_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 16])],
        [w1, w2],
    )
    return _model(graph, [])


def outlier_inputs(count: int, seed: int) -> np.ndarray:
    """Stack of ``count`` inputs whose channel 3 is ~40x the others, as in post-LayerNorm BERT activations."""
    x = np.random.default_rng(seed).standard_normal((count, 16, 64)).astype(np.float32)
    x[..., 3] *= 40
    return x


def attention_block(seed: int = 0) -> ir.Model:
    """com.microsoft Attention as fuse-ort leaves it: QKV weight behind a Concat, padding mask as attention_bias."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) * 0.2).astype(np.float32), name)
        for name in ("wq", "wk", "wv")
    ]
    inits += [
        numpy_helper.from_array((rng.standard_normal(3 * HIDDEN) * 0.1).astype(np.float32), "qkv_bias"),
        numpy_helper.from_array(np.array([1, 1, SEQ, SEQ], np.int64), "bias_shape"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest"),
    ]
    nodes = [
        helper.make_node("Concat", ["wq", "wk", "wv"], ["qkv_weight"], name="concat", axis=1),
        helper.make_node("Cast", ["mask"], ["keep"], name="to_bool", to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["keep", "axes"], ["keep4"], name="unsqueeze"),
        helper.make_node("Where", ["keep4", "zero", "lowest"], ["bias_row"], name="where"),
        helper.make_node("Expand", ["bias_row", "bias_shape"], ["attention_bias"], name="expand"),
        helper.make_node(
            "Attention",
            ["x", "qkv_weight", "qkv_bias", "", "", "attention_bias"],
            ["y"],
            name="attention",
            domain="com.microsoft",
            num_heads=HEADS,
            qkv_hidden_sizes=[HIDDEN] * 3,
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "attention_block",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, [1, SEQ]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        inits,
    )
    return _model(graph, [helper.make_opsetid("com.microsoft", 1)])


def attention_inputs(count: int, seed: int) -> dict[str, np.ndarray]:
    """Stacks of ``count`` (x, mask) pairs; each mask pads a different tail."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, 1, SEQ, HIDDEN)).astype(np.float32)
    mask = np.ones((count, 1, SEQ), np.int64)
    for i in range(count):
        mask[i, 0, SEQ - 1 - i % 4 :] = 0
    return {"x": x, "mask": mask}


def save_stack(directory: Path, arrays: dict[str, np.ndarray]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "samples.npz", **arrays)
    return str(directory)


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def _model(graph: onnx.GraphProto, extra_opsets: list) -> ir.Model:
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *extra_opsets])
    proto.ir_version = 8
    return ir.serde.deserialize_model(proto)


def skip_layer_norm_block(seed: int = 0, read_mean: bool = False) -> ir.Model:
    """Two chained com.microsoft SkipLayerNormalization (with bias), as fuse-ort leaves BERT's residuals."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "bias"),
    ]
    first_outputs = ["h", "mean"] if read_mean else ["h"]
    nodes = [
        helper.make_node(
            "SkipLayerNormalization",
            ["x", "s", "gamma", "beta", "bias"],
            first_outputs,
            name="sln1",
            domain="com.microsoft",
            epsilon=1e-5,
        ),
        helper.make_node(
            "SkipLayerNormalization",
            ["h", "x", "gamma", "beta"],
            ["y"],
            name="sln2",
            domain="com.microsoft",
            epsilon=1e-5,
        ),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, HIDDEN])]
    if read_mean:
        outputs.append(helper.make_tensor_value_info("mean", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "skip_layer_norm_block",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, SEQ, HIDDEN]) for n in ("x", "s")],
        outputs,
        inits,
    )
    return _model(graph, [helper.make_opsetid("com.microsoft", 1)])


def relu_mlp(path: Path, rows: int, dims: list[tuple[int, int]]) -> Path:
    """x[1, rows, K0] -> MatMul (seeded weights, one per ``dims`` entry) with a Relu between each, saved at ``path``."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal(d) * 0.2).astype(np.float32), f"w{i}") for i, d in enumerate(dims)
    ]
    nodes, x = [], "x"
    for i in range(len(dims)):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"fc{i}"))
        if i < len(dims) - 1:
            nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    last = len(dims) - 1
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, dims[0][0]])],
        [helper.make_tensor_value_info(f"h{last}", TensorProto.FLOAT, [1, rows, dims[-1][1]])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
