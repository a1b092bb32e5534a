"""int8 builds on tvm run their integer ops on the VNNI kernels and compute what ONNX Runtime computes."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import quick_build
from tests.int8_graphs import needs_vnni, qdq_chain
from tests.quant_models import relu_mlp


def _mlp(path: Path) -> Path:
    """x[1,12,64] -> MatMul 64x48 -> Relu -> MatMul 48x32 -> Relu -> MatMul 32x10 (N=10: no VNNI)."""
    return relu_mlp(path, 12, [(64, 48), (48, 32), (32, 10)])


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
    from aotforge.artifacts import load

    on_tvm, on_ort, x = _run_both(tmp_path)
    report = on_tvm.manifest.target.info["pipeline"]["schedules"]["int8_vnni"]
    assert report["rewritten"] == 2 and report["kernels"] == 2
    assert report["skipped"] == {"N=10 is not a multiple of 16": 1}
    got = load(on_tvm.path).run({"x": x})
    # The same integer arithmetic: ORT's int8 artifact is the reference, not fp32.
    expected = ort.InferenceSession(str(on_ort.path / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="cross-builds for an x86-64 CPU without VNNI")
def test_a_target_without_vnni_keeps_the_generic_integer_matmul(tmp_path: Path) -> None:
    from aotforge.artifacts import load

    on_tvm, on_ort, x = _run_both(tmp_path, mcpu="x86-64-v3")
    report = on_tvm.manifest.target.info["pipeline"]["schedules"]["int8_vnni"]
    assert report == {"rewritten": 0, "skipped": {"target x86-64-v3 has no avx512vnni": 3}}
    got = load(on_tvm.path).run({"x": x})
    expected = ort.InferenceSession(str(on_ort.path / "model.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), expected, rtol=1e-5, atol=1e-5)


@needs_vnni
def test_static_int8_convolutions_run_on_vnni_and_track_onnxruntime(tmp_path: Path) -> None:
    from aotforge.artifacts import load
    from tests.conftest import EXAMPLES

    common = {"passes": ("O1", "int8"), "tolerance": 0.3, "validation_samples": 1}
    model = str(EXAMPLES / "mini_resnet.py")
    on_tvm = quick_build(model, tmp_path / "tvm", target="tvm", **common)
    on_ort = quick_build(model, tmp_path / "ort", target="onnxruntime", **common)
    report = on_tvm.manifest.target.info["pipeline"]["schedules"]["int8_vnni"]
    assert report["by_op"]["conv2d"] >= 7 and report["skipped"] == {}
    x = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = next(iter(load(on_tvm.path).run({"image": x}).values()))
    expected = ort.InferenceSession(str(on_ort.path / "model.onnx")).run(None, {"image": x})[0]
    # Both compute in integers; requantizing rounds an odd element by one step differently.
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.02


@needs_vnni
@pytest.mark.slow
def test_minilm_tvm_int8_recipe_keeps_quality_with_every_projection_on_vnni(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import EXAMPLES, ROOT

    monkeypatch.chdir(ROOT)  # the recipe names its calibration callables relative to the repository root
    result = quick_build(str(EXAMPLES / "minilm.py"), tmp_path, recipe=EXAMPLES / "minilm_int8_tvm.toml")
    report = result.manifest.target.info["pipeline"]["schedules"]["int8_vnni"]
    assert report["by_op"] == {"matmul": 36} and report["skipped"] == {}
    held_out = next(p for p in result.manifest.passes if p["name"] == "int8-dynamic")["stats"]["eval"]
    assert held_out["mean"] >= 0.995 and held_out["min"] >= 0.99


@needs_vnni
def test_quantized_convolutions_stay_channels_last_and_match_onnxruntime(tmp_path: Path) -> None:
    """Between the three integer kernels nothing goes back to NCHW (no transpose is left) and the
    global mean reads NHWC; the artifact computes what ORT computes on the same QDQ graph."""
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.artifacts import load
    from aotforge.targets.tvm.relax_util import any_call, op_name
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    model = qdq_chain(tmp_path / "chain.onnx")
    mod, report = rewrite_integer_ops(from_onnx(onnx.load(model), keep_params_in_input=False))
    assert report is not None and report["by_op"] == {"conv2d": 2, "depthwise_conv2d": 1}
    assert report["channels_last_ops"] > 0
    # A bias's [1, C, 1, 1] -> [1, 1, 1, C] is the only kind of transpose allowed.
    assert not any_call(mod, lambda e: op_name(e) == "relax.permute_dims" and sum(int(d) > 1 for d in e.ty.shape) > 1)
    assert any_call(mod, lambda e: op_name(e) == "relax.mean" and [int(a) for a in e.attrs.axis] == [1, 2])
    built = quick_build(str(model), tmp_path / "tvm", target="tvm", tolerance=1e-3, validation_samples=1)
    x = np.random.default_rng(6).standard_normal((1, 3, 12, 12)).astype(np.float32)
    got = next(iter(load(built.path).run({"x": x}).values()))
    expected = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
