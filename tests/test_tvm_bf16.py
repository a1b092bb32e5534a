"""bf16 graphs on tvm: NaN / Inf tests on bf16 build (on an fp32 copy), a small encoder matches fp32."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from aotforge.targets.tvm.options import TvmOptions, target_dict
from aotforge.targets.tvm.rewrites.bf16 import rewrite_bf16
from tests.conftest import quick_build

HIDDEN, HEADS, FFN, VOCAB = 32, 2, 64, 16


def test_bf16_nan_and_inf_tests_build_and_are_exact() -> None:
    x = relax.Var("x", relax.TensorType((6,), "bfloat16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            checks = [bb.emit(op(x)) for op in (relax.op.isnan, relax.op.isinf, relax.op.isfinite)]
            out = bb.emit_output(relax.Tuple(checks))
        bb.emit_func_output(out)
    mod, report = rewrite_bf16(bb.get())
    assert report == {"checks_in_fp32": 3}
    assert rewrite_bf16(mod)[1] is None  # idempotent: the tests now read fp32
    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target(target_dict(TvmOptions()))), tvm.cpu())
    values = np.array([np.nan, np.inf, -np.inf, 1.0, 0.0, -3e38], dtype=ml_dtypes.bfloat16)
    got = [t.numpy() for t in vm["main"](tvm.runtime.tensor(values))]
    wide = values.astype(np.float32)
    for result, expected in zip(got, (np.isnan(wide), np.isinf(wide), np.isfinite(wide)), strict=True):
        np.testing.assert_array_equal(result, expected)


def _encoder(path: Path, seq: int) -> Path:
    """One two-head attention block + GELU FFN + masked mean pooling + L2 normalisation, as MiniLM exports them.

    The two ``Clip``s with a tensor ``min`` (pooling's ``clamp(min=1e-9)``, ``normalize``'s eps) are
    what the Relax importer guards with ``where(isnan(min), ...)``: bf16 bounds failed the build.
    At ``seq`` 1 the attention's ``p @ v`` is a K=1 matmul (its own kernel: a Transpose follows),
    which tvm schedules in place.
    """
    rng = np.random.default_rng(0)

    def const(name: str, value: np.ndarray | float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)

    weights = [const("table", rng.standard_normal((VOCAB, HIDDEN)))]
    weights += [const(n, rng.standard_normal((HIDDEN, HIDDEN)) / HIDDEN**0.5) for n in ("wq", "wk", "wv")]
    weights += [const("w1", rng.standard_normal((HIDDEN, FFN)) / HIDDEN**0.5)]
    weights += [const("w2", rng.standard_normal((FFN, HIDDEN)) / FFN**0.5)]
    weights += [const("gamma", np.ones(HIDDEN)), const("beta", np.zeros(HIDDEN))]
    weights += [const("scale", (HIDDEN // HEADS) ** -0.5), const("zero", 0.0), const("neg", -3.4e38), const("one", 1.0)]
    weights += [const("half", 0.5), const("sqrt2", 2**0.5), const("eps9", 1e-9), const("eps12", 1e-12)]
    weights += [numpy_helper.from_array(np.array(a, np.int64), f"axes{a[0]}") for a in ([1], [2])]
    weights += [numpy_helper.from_array(np.array([1, 2], np.int64), "axes12")]
    weights += [numpy_helper.from_array(np.array([1, seq, HEADS, HIDDEN // HEADS], np.int64), "heads")]
    weights += [numpy_helper.from_array(np.array([1, seq, HIDDEN], np.int64), "merged")]
    node = helper.make_node
    nodes = [
        node("Gather", ["table", "input_ids"], ["emb"]),
        *(node("MatMul", ["emb", f"w{n}"], [f"{n}0"]) for n in "qkv"),
        *(node("Reshape", [f"{n}0", "heads"], [f"{n}1"]) for n in "qkv"),
        node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        node("MatMul", ["q", "kt"], ["s"]),
        node("Mul", ["s", "scale"], ["s2"]),
        node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["maskf", "axes12"], ["mask3"]),
        node("Equal", ["mask3", "zero"], ["masked"]),
        node("Where", ["masked", "neg", "zero"], ["bias"]),
        node("Add", ["s2", "bias"], ["s3"]),
        node("Softmax", ["s3"], ["p"], axis=-1),
        node("MatMul", ["p", "v"], ["a0"]),
        node("Transpose", ["a0"], ["a1"], perm=[0, 2, 1, 3]),
        node("Reshape", ["a1", "merged"], ["a"]),
        node("Add", ["a", "emb"], ["r"]),
        node("LayerNormalization", ["r", "gamma", "beta"], ["ln"], axis=-1),
        node("MatMul", ["ln", "w1"], ["f1"]),
        node("Div", ["f1", "sqrt2"], ["f1s"]),
        node("Erf", ["f1s"], ["erf"]),
        node("Add", ["erf", "one"], ["erf1"]),
        node("Mul", ["f1", "erf1"], ["g0"]),
        node("Mul", ["g0", "half"], ["g"]),
        node("MatMul", ["g", "w2"], ["f2"]),
        node("Add", ["f2", "ln"], ["h"]),
        node("Unsqueeze", ["maskf", "axes2"], ["mask4"]),
        node("Mul", ["h", "mask4"], ["hm"]),
        node("ReduceSum", ["hm", "axes1"], ["total"], keepdims=0),
        node("ReduceSum", ["mask4", "axes1"], ["count"], keepdims=0),
        node("Clip", ["count", "eps9"], ["count_c"]),
        node("Div", ["total", "count_c"], ["pooled"]),
        node("ReduceL2", ["pooled"], ["norm"], axes=[1], keepdims=1),
        node("Clip", ["norm", "eps12"], ["norm_c"]),
        node("Div", ["pooled", "norm_c"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, [1, seq]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, HIDDEN])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("seq", [8, 1])
def test_bf16_encoder_builds_on_tvm_and_matches_fp32(tmp_path: Path, seq: int) -> None:
    from aotforge.artifacts import load

    model = _encoder(tmp_path / "encoder.onnx", seq)
    result = quick_build(str(model), tmp_path / "out", target="tvm", passes=("bf16",), tolerance=0.03)
    manifest = result.manifest
    report = manifest.target.info["pipeline"]["schedules"]["bf16"]
    assert report == {"checks_in_fp32": 2, "matmuls_fp32_accumulate": 7, "transcendentals_in_fp32": 1}
    bf16 = next(p for p in manifest.passes if p["name"] == "bf16")
    assert bf16["stats"]["kept_fp32"]["ReduceL2"] == 1  # a sum of squares in bf16 is a ~3% norm bias
    assert manifest.validation["metrics"]["embedding"]["cosine"] > 0.999
    rng = np.random.default_rng(7)
    inputs = {"input_ids": rng.integers(0, VOCAB, (1, seq)), "attention_mask": np.ones((1, seq), np.int64)}
    inputs["attention_mask"][0, max(1, seq // 2) :] = 0
    got = load(result.path).run(inputs)["embedding"]
    expected = ort.InferenceSession(str(model)).run(None, inputs)[0]
    # bf16 keeps 8 significant bits: ~0.4% per rounding, a few roundings deep.
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.03
    np.testing.assert_allclose(np.linalg.norm(got), 1.0, rtol=0.01)
