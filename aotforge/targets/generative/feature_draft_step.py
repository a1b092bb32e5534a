"""The feature draft's step as an int8 ONNX graph run by ONNX Runtime: what speculative decoding proposes with.

A proposal reads every weight of the draft once (the head over the sub-vocabulary is most of them: 8192 x 576
floats, 19 MB, for SmolLM2), right after the target's step has streamed its own weights through the caches, so a
float32 step costs about what its bytes take to read from memory. The same graph with its matrices in int8
(``MatMulNBits``, blocks of 32, symmetric; int8 activations) reads a quarter of that. The draft's numerics only
decide which tokens are proposed: the target verifies each one, so greedy output stays the target's own and
sampled output keeps the target's distribution (the acceptance rule reads the ``q`` the proposals were drawn
from, these logits). ``FeatureDraft.reference_step`` is the float32 contract it is checked against.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The int8 layout: ONNX Runtime's ``MatMulNBits`` blocks; accuracy level 4 multiplies in int8.
BITS, BLOCK_SIZE, ACCURACY_LEVEL = 8, 32, 4
_MATRICES = ("fc", "gate", "up", "down", "head")


class CompiledStep:
    """``(hidden [B, d], tokens [B]) -> (y [B, d], logits [B, n])`` on one ONNX Runtime thread, the embedding
    lookup in numpy (a row read a token)."""

    def __init__(self, weights: Mapping[str, np.ndarray], rms_eps: float) -> None:
        import onnxruntime as ort

        self.embed = weights["embed"]
        options = ort.SessionOptions()
        # A GEMV of a row or a few: one thread, and no spinning that would take a core from the target's threads.
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        model = _int8(_graph(weights, rms_eps))
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def __call__(self, hidden: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = {"embedded": self.embed[tokens], "hidden": np.ascontiguousarray(hidden, dtype=np.float32)}
        y, logits = self.session.run(["y", "logits"], inputs)
        return y, logits


def _graph(weights: Mapping[str, np.ndarray], rms_eps: float) -> Any:
    """``FeatureDraft.reference_step`` as ONNX (opset 17): ``z = [e, h] fc^T + b``, ``r = rms_norm(z) * norm``,
    ``y = z + (silu(r gate^T) * (r up^T)) down^T``, ``logits = y head^T``; matrices stored ``[in, out]``."""
    from onnx import TensorProto, helper, numpy_helper

    d = int(weights["norm"].shape[0])
    initializers = [numpy_helper.from_array(np.ascontiguousarray(weights[m].T, np.float32), m) for m in _MATRICES]
    initializers += [
        numpy_helper.from_array(np.asarray(weights["fc_bias"], np.float32), "fc_bias"),
        numpy_helper.from_array(np.asarray(weights["norm"], np.float32), "norm"),
        numpy_helper.from_array(np.array(rms_eps, np.float32), "eps"),
    ]
    node = helper.make_node
    nodes = [
        node("Concat", ["embedded", "hidden"], ["joined"], axis=-1),
        node("MatMul", ["joined", "fc"], ["z0"]),
        node("Add", ["z0", "fc_bias"], ["z"]),
        node("Mul", ["z", "z"], ["z2"]),
        node("ReduceMean", ["z2"], ["mean2"], axes=[-1], keepdims=1),
        node("Add", ["mean2", "eps"], ["var"]),
        node("Sqrt", ["var"], ["rms"]),
        node("Div", ["z", "rms"], ["normed"]),
        node("Mul", ["normed", "norm"], ["r"]),
        node("MatMul", ["r", "gate"], ["g"]),
        node("Sigmoid", ["g"], ["sig"]),
        node("Mul", ["g", "sig"], ["silu"]),
        node("MatMul", ["r", "up"], ["u"]),
        node("Mul", ["silu", "u"], ["mixed"]),
        node("MatMul", ["mixed", "down"], ["mlp"]),
        node("Add", ["z", "mlp"], ["y"]),
        node("MatMul", ["y", "head"], ["logits"]),
    ]
    n = int(weights["head"].shape[0])
    graph = helper.make_graph(
        nodes,
        "feature_draft_step",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", d]) for x in ("embedded", "hidden")],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _int8(model: Any) -> Any:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # It logs a line for each node it quantizes or skips.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        model, bits=BITS, block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL
    )
    quantizer.process()
    return quantizer.model.model
