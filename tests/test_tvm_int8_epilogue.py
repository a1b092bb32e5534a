"""Static int8 CNNs on tvm: the convolution kernels requantize in their write-back, and the rewrite
that moves each conv's bias / clip / requantize chain there computes what ONNX Runtime computes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm

from aotforge.targets.tvm.kernels import int8_depthwise, requantize, vnni_conv
from tests.int8_graphs import host_target, needs_vnni, qdq_chain


def _exact_conv(padded: np.ndarray, weight: np.ndarray, za: int, stride: int, groups: int) -> np.ndarray:
    """int64 NHWC convolution of the zero-point-centred padded input (the kernels' int32 result)."""
    import torch

    c = weight.shape[1] * groups
    centered = torch.tensor(padded[..., :c].transpose(0, 3, 1, 2).astype(np.float64) - float(za))
    out = torch.nn.functional.conv2d(centered, torch.tensor(weight.astype(np.float64)), stride=stride, groups=groups)
    return out.numpy().transpose(0, 2, 3, 1).astype(np.int64)


def _table(rng: np.random.Generator, o: int, out_dtype: str) -> np.ndarray:
    """A per-channel map as a conv epilogue folds it: scale, bias + zero point, ReLU6-style bounds."""
    scale = rng.uniform(1e-4, 3e-3, o)
    shift = rng.uniform(-20, 20, o) + (0 if out_dtype == "int8" else 100)
    low, high = np.full(o, 100.0 if out_dtype == "uint8" else -5.0), np.full(o, 230.0)
    return requantize.table(scale, shift, low, high, out_dtype)


def _run(func: Any, arrays: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func}), target=host_target())
    args = [tvm.runtime.tensor(v) for v in (*arrays, out)]
    lib["main"](*args)
    return args[-1].numpy()


@needs_vnni
@pytest.mark.parametrize(("c", "o", "k", "stride", "out_dtype"), [(32, 48, 1, 1, "uint8"), (4, 16, 3, 2, "int8")])
def test_vnni_conv_requantizes_in_its_write_back(c: int, o: int, k: int, stride: int, out_dtype: str) -> None:
    rng = np.random.default_rng(c + o)
    pad, size = k // 2, 9
    padded = rng.integers(0, 256, (1, size + 2 * pad, size + 2 * pad, c), dtype=np.uint8)
    weight = rng.integers(-128, 128, (o, c, k, k), dtype=np.int8)
    za, rows = 7, _table(rng, o, out_dtype)
    out_hw = ((size + 2 * pad - k) // stride + 1,) * 2
    func = vnni_conv.conv2d_u8s8(1, *padded.shape[1:3], c, o, k, k, (stride, stride), out_hw, out_dtype)
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    arrays = [padded, vnni_conv.pack_weight(weight, c), np.array(za, np.uint8), colsum, rows]
    got = _run(func, arrays, np.zeros((1, *out_hw, o), out_dtype))
    expected = requantize.reference(_exact_conv(padded, weight, za, stride, 1), rows, out_dtype)
    assert got.dtype == np.dtype(out_dtype)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 20  # the bounds clip some, not all


@needs_vnni
@pytest.mark.parametrize(("c", "stride"), [(16, 1), (64, 2)])
def test_int8_depthwise_requantizes_in_its_write_back(c: int, stride: int) -> None:
    rng = np.random.default_rng(c)
    size = 10
    padded = rng.integers(0, 256, (1, size + 2, size + 2, c), dtype=np.uint8)
    weight = rng.integers(-128, 128, (c, 1, 3, 3), dtype=np.int8)
    za, rows = 100, _table(rng, c, "uint8")
    rows[0] *= 50  # 9 taps, not hundreds: a scale that spreads them over the byte
    out_hw = ((size + 2 - 3) // stride + 1,) * 2
    func = int8_depthwise.depthwise_u8s8(1, *padded.shape[1:3], c, 3, 3, (stride, stride), out_hw, "uint8")
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    arrays = [padded, int8_depthwise.pack_weight(weight), np.array(za, np.uint8), colsum, rows]
    got = _run(func, arrays, np.zeros((1, *out_hw, c), np.uint8))
    expected = requantize.reference(_exact_conv(padded, weight, za, stride, c), rows, "uint8")
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(got)) > 20


def _rewritten(model: onnx.ModelProto) -> tuple[Any, Any]:
    """``model`` imported and through the pipeline's Clip and int8 steps, in its order."""
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.targets.tvm.rewrites.clip import clip_as_min_max
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    mod, _ = clip_as_min_max(from_onnx(model, keep_params_in_input=False))
    return rewrite_integer_ops(mod)


def _calls(mod: Any) -> list[Any]:
    from tvm import relax

    found: list[Any] = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


@needs_vnni
def test_bias_clip_and_requantize_move_into_the_kernels_and_match_onnxruntime(tmp_path: Path) -> None:
    """Every convolution's bias / Clip / Relu / requantize rides its kernel's write-back (no float
    convolution result and no quantize is left between the kernels), and the artifact computes
    what ONNX Runtime computes on the same QDQ graph, to one requantize step."""

    from aotforge.artifacts import load
    from aotforge.targets.tvm.relax_util import op_name
    from tests.conftest import quick_build

    model = qdq_chain(tmp_path / "block.onnx", bias=True, activations=("Clip", "Relu", ""))
    mod, report = _rewritten(onnx.load(model))
    assert report is not None and report["requantize_epilogues"] == 2 and report["epilogues_left"] == {}
    # Only the last conv's float result (the mean reads it) is left to cast; no clip, no transpose.
    ops = [op_name(e) for e in _calls(mod)]
    assert ops.count("relax.astype") == 1 and "relax.quantize" not in ops and "relax.maximum" not in ops
    assert not any(op_name(e) == "relax.permute_dims" and sum(int(d) > 1 for d in e.ty.shape) > 1 for e in _calls(mod))
    # the depthwise conv on the VNNI kernel, whose bias / requantize table is in its lane order
    assert any(gv.name_hint.startswith("vnni_depthwise") for gv in mod.get_global_vars())
    built = quick_build(str(model), tmp_path / "tvm", target="tvm", tolerance=0.05, validation_samples=1)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    runner = load(built.path)
    for seed in range(3):
        x = np.random.default_rng(seed).uniform(-1, 3, (1, 3, 12, 12)).astype(np.float32)
        got, expected = runner.run({"x": x})["y"], session.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, expected, atol=0.02 * np.abs(expected).max())


@needs_vnni
def test_a_convolution_result_read_twice_keeps_its_float_epilogue(tmp_path: Path) -> None:
    _, report = _rewritten(onnx.load(qdq_chain(tmp_path / "twice.onnx", bias=True, second_reader=True)))
    assert report is not None and report["requantize_epilogues"] == 1
    assert report["epilogues_left"] == {"a value between the convolution and its requantize has another reader": 1}


@needs_vnni
@pytest.mark.slow
@pytest.mark.parametrize(("arch", "size"), [("mobilenet_v2", 64), ("resnet", 48)])
def test_transformers_cnns_from_config_run_int8_on_tvm_as_onnxruntime_does(
    arch: str, size: int, tmp_path: Path
) -> None:
    """transformers' own MobileNetV2 (depthwise, ReLU6, inverted residuals) and ResNet (random weights,
    models we did not write) through static ``int8`` on tvm: every convolution requantizes in its
    kernel, and the artifact computes what ONNX Runtime computes on the same QDQ graph."""
    import aotforge
    from tests import hf_models, user_cnn
    from tests.conftest import quick_build

    spec = hf_models.ARCHITECTURES[arch]
    np.save(tmp_path / "images.npy", user_cnn.images(32, seed=1, size=size))
    result = quick_build(
        str(hf_models.save_model(arch, tmp_path)),
        tmp_path / "out",
        task=spec.task,
        target="tvm",
        passes=["O1", "int8"],
        calibration=str(tmp_path),
        tolerance=0.3,
    )
    report = result.manifest.target.info["pipeline"]["schedules"]["int8_vnni"]
    convs = report["by_op"].get("conv2d", 0) + report["by_op"].get("depthwise_conv2d", 0)
    assert convs >= 6 and report["requantize_epilogues"] >= convs - 4, str(report)
    session = ort.InferenceSession(str(result.path / "model.onnx"), providers=["CPUExecutionProvider"])
    runner = aotforge.load(result.path)
    images = user_cnn.images(16, seed=2, size=size)
    got = np.concatenate([next(iter(runner.run({"pixel_values": x}).values())) for x in images])
    expected = np.concatenate([session.run(None, {"pixel_values": x})[0] for x in images])
    # Both compute in integers; a requantize rounds an odd element by one step differently.
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.03
    assert np.mean(got.argmax(1) == expected.argmax(1)) >= 0.9
