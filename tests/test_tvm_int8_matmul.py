"""int8-dynamic graphs on tvm: the VNNI dense kernel is exact, the rewrite fires where it can and says why not."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

tvm = pytest.importorskip("tvm")

from tvm.target.codegen import target_has_features  # noqa: E402

from targets.tvm_schedules import vnni_dense  # noqa: E402
from targets.tvm_target import TvmOptions, target_dict  # noqa: E402
from tests.conftest import quick_build  # noqa: E402


def _host() -> Any:
    return tvm.target.Target(target_dict(TvmOptions()))


needs_vnni = pytest.mark.skipif(
    not target_has_features("avx512vnni", _host()), reason="this CPU has no AVX-512 VNNI to run the kernel on"
)


@needs_vnni
@pytest.mark.parametrize(("m", "k", "n"), [(8, 64, 48), (13, 20, 32), (1, 4, 16), (24, 128, 96)])
def test_vnni_dense_is_exact(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * k + n)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    za = np.array(rng.integers(0, 256), dtype=np.uint8)
    colsum = w.astype(np.int32).sum(axis=0, dtype=np.int32)
    lib = tvm.compile(tvm.IRModule({"main": vnni_dense.dense_u8s8(m, k, n)}), target=_host())
    args = [tvm.runtime.tensor(x) for x in (a, vnni_dense.pack_weight(w), za, colsum, np.zeros((m, n), np.int32))]
    lib["main"](*args)
    expected = (a.astype(np.int64) - int(za)) @ w.astype(np.int64)
    np.testing.assert_array_equal(args[-1].numpy(), expected)


def test_shapes_the_kernel_cannot_take_say_why() -> None:
    assert vnni_dense.supports(128, 384, 1536) == ""
    assert "K=6" in vnni_dense.supports(4, 6, 16)
    assert "N=10" in vnni_dense.supports(4, 8, 10)


def _mlp(path: Path) -> Path:
    """x[1,12,64] -> MatMul 64x48 -> Relu -> MatMul 48x32 -> Relu -> MatMul 32x10 (N=10: no VNNI)."""
    rng = np.random.default_rng(0)
    dims = [(64, 48), (48, 32), (32, 10)]
    weights = [
        numpy_helper.from_array((rng.standard_normal(d) * 0.2).astype(np.float32), f"w{i}") for i, d in enumerate(dims)
    ]
    nodes, x = [], "x"
    for i in range(len(dims)):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"fc{i}"))
        if i < len(dims) - 1:
            nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 64])],
        [helper.make_tensor_value_info("h2", TensorProto.FLOAT, [1, 12, 10])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def _run_both(tmp_path: Path, **target_options: Any) -> tuple[Any, Any, np.ndarray]:
    model = _mlp(tmp_path / "mlp.onnx")
    passes = ("O1", "int8-dynamic")
    common = {"passes": passes, "tolerance": 0.3, "validation_samples": 1}
    on_tvm = quick_build(str(model), tmp_path / "tvm", target="tvm", target_options=target_options, **common)
    on_ort = quick_build(str(model), tmp_path / "ort", target="onnxruntime", **common)
    x = np.random.default_rng(1).standard_normal((1, 12, 64)).astype(np.float32)
    return on_tvm, on_ort, x


@needs_vnni
def test_int8_dynamic_matmuls_run_on_vnni_and_match_onnxruntime(tmp_path: Path) -> None:
    from artifacts import load

    on_tvm, on_ort, x = _run_both(tmp_path)
    report = on_tvm.manifest.target["info"]["pipeline"]["schedules"]["int8_matmul"]
    assert report["rewritten"] == 2 and report["kernels"] == 2
    assert report["skipped"] == {"N=10 is not a multiple of 16": 1}
    got = load(on_tvm.path).run({"x": x})
    # The same integer arithmetic: ORT's int8 artifact is the reference, not fp32.
    expected = ort.InferenceSession(str(on_ort.path / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="cross-builds for an x86-64 CPU without VNNI")
def test_a_target_without_vnni_keeps_the_generic_integer_matmul(tmp_path: Path) -> None:
    from artifacts import load

    on_tvm, on_ort, x = _run_both(tmp_path, mcpu="x86-64-v3")
    report = on_tvm.manifest.target["info"]["pipeline"]["schedules"]["int8_matmul"]
    assert report == {"rewritten": 0, "skipped": {"target x86-64-v3 has no avx512vnni": 3}}
    got = load(on_tvm.path).run({"x": x})
    expected = ort.InferenceSession(str(on_ort.path / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-5, atol=1e-5)
