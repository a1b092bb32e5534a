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

from aotforge.targets.tvm.kernels import vnni_dense  # noqa: E402
from aotforge.targets.tvm.options import TvmOptions, target_dict  # noqa: E402
from tests.conftest import quick_build  # noqa: E402
from tests.quant_models import relu_mlp  # noqa: E402


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


def test_a_ragged_row_count_is_padded_to_whole_row_tiles() -> None:
    """37 rows (ViT's tokens) have no row tile but 1: the kernel runs on 40 rows and the 3 extra go."""
    from tvm import relax

    from aotforge.targets.tvm.relax_util import any_call, op_name
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    mod, report = rewrite_integer_ops(_matmul_integer(rows=37))
    assert report is not None and report["by_op"] == {"matmul": 1}
    assert "vnni_dense_40x64x32" in [gv.name_hint for gv in mod.get_global_vars()]
    assert any_call(mod, lambda e: op_name(e) == "relax.strided_slice")
    if target_has_features("avx512vnni", _host()):
        a = np.random.default_rng(7).integers(0, 256, (37, 64), dtype=np.uint8)
        vm = relax.VirtualMachine(tvm.compile(mod, target=_host()), tvm.cpu())
        w = [numpy_helper.to_array(t) for t in _matmul_integer_graph(rows=37).initializer if t.name == "w"][0]
        expected = (a.astype(np.int64) - 7) @ w.astype(np.int64)
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), expected)


def test_matmuls_reading_one_activation_pad_it_once() -> None:
    """Q, K and V read one quantized activation: its row padding is emitted once, not per matmul."""
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.targets.tvm.relax_util import relax_functions
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    graph = _matmul_integer_graph(rows=37)
    graph.node.append(helper.make_node("MatMulInteger", ["a", "w", "za", "wz"], ["y2"]))
    graph.output.append(helper.make_tensor_value_info("y2", TensorProto.INT32, [37, 32]))
    mod = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), keep_params_in_input=False)
    mod, report = rewrite_integer_ops(mod)
    assert report is not None and report["by_op"] == {"matmul": 2}
    (_, main), *_ = relax_functions(mod)
    assert main.script().count("R.nn.pad(") == 1


def test_shapes_the_kernel_cannot_take_say_why() -> None:
    assert vnni_dense.supports(128, 384, 1536) == ""
    assert "K=6" in vnni_dense.supports(4, 6, 16)
    assert "N=10" in vnni_dense.supports(4, 8, 10)


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
@pytest.mark.parametrize(("c", "o", "k", "stride", "pad"), [(32, 32, 3, 1, 1), (3, 16, 7, 2, 3), (16, 32, 1, 2, 0)])
def test_vnni_conv2d_is_exact(c: int, o: int, k: int, stride: int, pad: int) -> None:
    import torch

    from aotforge.targets.tvm.kernels import vnni_conv

    rng = np.random.default_rng(c + o + k)
    h = w = 10
    x = rng.integers(0, 256, (1, c, h, w), dtype=np.uint8)
    weight = rng.integers(-128, 128, (o, c, k, k), dtype=np.int8)
    za = np.uint8(rng.integers(0, 256))
    channels = -(-c // 4) * 4
    padded = np.full((1, h + 2 * pad, w + 2 * pad, channels), za, np.uint8)
    padded[:, pad : pad + h, pad : pad + w, :c] = x.transpose(0, 2, 3, 1)
    out_hw = ((h + 2 * pad - k) // stride + 1,) * 2
    func = vnni_conv.conv2d_u8s8(1, *padded.shape[1:3], channels, o, k, k, (stride, stride), out_hw)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=_host())
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    out = np.zeros((1, *out_hw, o), np.int32)
    args = [tvm.runtime.tensor(v) for v in (padded, vnni_conv.pack_weight(weight, channels), np.array(za), colsum, out)]
    lib["main"](*args)
    centered = torch.tensor(padded[..., :c].transpose(0, 3, 1, 2).astype(np.float64) - float(za))
    expected = torch.nn.functional.conv2d(centered, torch.tensor(weight.astype(np.float64)), stride=stride)
    np.testing.assert_array_equal(args[-1].numpy(), expected.numpy().transpose(0, 2, 3, 1).astype(np.int64))


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


def _matmul_integer_graph(
    *, a_type: int = TensorProto.UINT8, weight_zero: int = 0, weight_const: bool = True, rows: int = 4
) -> Any:
    """``MatMulInteger(a, w, za, wz)`` as ``int8-dynamic`` emits it (the ONNX graph)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(-128, 128, (64, 32), dtype=np.int8), "w")
    zeros = [
        numpy_helper.from_array(np.array(7, np.uint8 if a_type == TensorProto.UINT8 else np.int8), "za"),
        numpy_helper.from_array(np.array(weight_zero, np.int8), "wz"),
    ]
    inputs = [helper.make_tensor_value_info("a", a_type, [rows, 64])]
    if not weight_const:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.INT8, [64, 32]))
    return helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "za", "wz"], ["y"])],
        "matmul_integer",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.INT32, [rows, 32])],
        zeros + ([w] if weight_const else []),
    )


def _matmul_integer(**graph: Any) -> Any:
    """``_matmul_integer_graph`` through the Relax ONNX importer."""
    from tvm.relax.frontend.onnx import from_onnx

    model = helper.make_model(_matmul_integer_graph(**graph), opset_imports=[helper.make_opsetid("", 17)])
    return from_onnx(model, keep_params_in_input=False)


@pytest.mark.parametrize(
    ("graph", "skipped"),
    [
        ({}, {}),
        ({"a_type": TensorProto.INT8}, {"activation is not uint8": 1}),
        ({"weight_zero": 3}, {"weight zero point is not a constant zero": 1}),
        ({"weight_const": False}, {"weight is not a constant": 1}),
    ],
)
def test_integer_matmul_rule_rewrites_or_reports_why_not(graph: dict[str, Any], skipped: dict[str, int]) -> None:
    from aotforge.targets.tvm.rewrites.int8 import count_integer_ops, rewrite_integer_ops

    mod = _matmul_integer(**graph)
    assert count_integer_ops(mod) == 1
    _, report = rewrite_integer_ops(mod)
    assert report is not None and report["skipped"] == skipped
    assert report["by_op"] == ({} if skipped else {"matmul": 1}) and report["kernels"] == (0 if skipped else 1)


def _qdq_conv(out_channels: int, group: int, in_channels: int = 8) -> Any:
    """``Conv(DequantizeLinear(x_u8), DequantizeLinear(w_s8))`` as static ``int8`` leaves it, imported."""
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array(
            rng.integers(-127, 128, (out_channels, in_channels // group, 3, 3), dtype=np.int8), "w"
        ),
        numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
        numpy_helper.from_array(np.array(9, np.uint8), "zx"),
        numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
        numpy_helper.from_array(np.array(0, np.int8), "zw"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
        helper.make_node("Conv", ["xf", "wf"], ["y"], pads=[1, 1, 1, 1], group=group),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_conv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, in_channels, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, 6, 6])],
        inits,
    )
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), keep_params_in_input=False)


@pytest.mark.parametrize(
    ("out_channels", "group", "in_channels", "applied", "skipped"),
    [
        (16, 1, 8, "conv2d", {}),
        (16, 16, 16, "depthwise_conv2d", {}),
        (16, 2, 8, "", {"grouped convolution with 4 channels per group (only depthwise is supported)": 1}),
        (8, 1, 8, "", {"8 output channels are not a multiple of 16": 1}),
        (8, 8, 8, "", {"depthwise convolution's 8 channels are not a multiple of 16": 1}),
        (32, 16, 16, "", {"depthwise channel multiplier 2 (only 1 is supported)": 1}),
    ],
)
def test_qdq_conv_rule_rewrites_or_reports_why_not(
    out_channels: int, group: int, in_channels: int, applied: str, skipped: dict[str, int]
) -> None:
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    _, report = rewrite_integer_ops(_qdq_conv(out_channels, group, in_channels))
    assert report is not None and report["skipped"] == skipped
    assert report["by_op"] == ({applied: 1} if applied else {})


@needs_vnni
@pytest.mark.parametrize(
    ("c", "size", "k", "stride", "pad"), [(16, 10, 3, 1, 1), (32, 9, 3, 2, 1), (48, 7, 5, 1, 2), (64, 8, 3, 2, 0)]
)
def test_int8_depthwise_is_exact(c: int, size: int, k: int, stride: int, pad: int) -> None:
    import torch

    from aotforge.targets.tvm.kernels import int8_depthwise

    rng = np.random.default_rng(c + size + k)
    x = rng.integers(0, 256, (1, size, size, c), dtype=np.uint8)
    weight = rng.integers(-128, 128, (c, 1, k, k), dtype=np.int8)
    za = np.uint8(rng.integers(0, 256))
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=za)
    out_hw = ((size + 2 * pad - k) // stride + 1,) * 2
    func = int8_depthwise.depthwise_u8s8(1, *padded.shape[1:3], c, k, k, (stride, stride), out_hw)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=_host())
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    packed = int8_depthwise.pack_weight(weight)
    args = [tvm.runtime.tensor(v) for v in (padded, packed, np.array(za), colsum, np.zeros((1, *out_hw, c), np.int32))]
    lib["main"](*args)
    centered = torch.tensor(padded.transpose(0, 3, 1, 2).astype(np.float64) - float(za))
    expected = torch.nn.functional.conv2d(centered, torch.tensor(weight.astype(np.float64)), stride=stride, groups=c)
    np.testing.assert_array_equal(args[-1].numpy(), expected.numpy().transpose(0, 2, 3, 1).astype(np.int64))


def _qdq_chain(path: Path) -> Path:
    """QDQ stem 3x3 (16) -> depthwise 3x3 -> pointwise 1x1 (32) -> + residual-free mean: quantized the
    way static ``int8`` leaves a CNN (every Conv between DequantizeLinear and QuantizeLinear)."""
    rng = np.random.default_rng(5)
    inits, nodes, x = [], [], "x"
    for i, (cout, cin, k, group) in enumerate([(16, 3, 3, 1), (16, 1, 3, 16), (32, 16, 1, 1)]):
        inits += [
            numpy_helper.from_array(rng.integers(-127, 128, (cout, cin, k, k), dtype=np.int8), f"w{i}"),
            numpy_helper.from_array(rng.uniform(0.001, 0.003, cout).astype(np.float32), f"sw{i}"),
            numpy_helper.from_array(np.zeros(cout, np.int8), f"zw{i}"),
            numpy_helper.from_array(np.array(0.05, np.float32), f"s{i}"),
            numpy_helper.from_array(np.array(100 + i, np.uint8), f"z{i}"),
        ]
        nodes += [
            helper.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
            helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
            helper.make_node("DequantizeLinear", [f"w{i}", f"sw{i}", f"zw{i}"], [f"wf{i}"], axis=0),
            helper.make_node("Conv", [f"d{i}", f"wf{i}"], [f"c{i}"], pads=[k // 2] * 4, group=group),
        ]
        x = f"c{i}"
    nodes.append(helper.make_node("ReduceMean", [x], ["y"], axes=[2, 3], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "qdq_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_vnni
def test_quantized_convolutions_stay_channels_last_and_match_onnxruntime(tmp_path: Path) -> None:
    """Between the three integer kernels nothing goes back to NCHW (no transpose is left) and the
    global mean reads NHWC; the artifact computes what ORT computes on the same QDQ graph."""
    from tvm.relax.frontend.onnx import from_onnx

    from aotforge.artifacts import load
    from aotforge.targets.tvm.relax_util import any_call, op_name
    from aotforge.targets.tvm.rewrites.int8 import rewrite_integer_ops

    model = _qdq_chain(tmp_path / "chain.onnx")
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


def test_vnni_and_depthwise_tiles_under_1_kib_use_no_workspace() -> None:
    """Accumulator tiles under 1 KiB are stack arrays and the activation word is no buffer: no
    TVMBackendAllocWorkspace / FreeWorkspace pair per tile (MobileNet-style int8: ~15% of a call).
    Compiled only, for a VNNI CPU, so it runs on any host."""
    from aotforge.targets.tvm.kernels import int8_depthwise, vnni_conv

    target = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "mtriple": "x86_64-linux-gnu"})
    kernels = {
        "conv 1x1, 6 x 32 tile": vnni_conv.conv2d_u8s8(1, 12, 12, 128, 256, 1, 1, (1, 1), (12, 12)),
        "dense 8 x 16": vnni_dense.dense_u8s8(8, 64, 16),
        "depthwise 3x3": int8_depthwise.depthwise_u8s8(1, 14, 14, 64, 3, 3, (1, 1), (12, 12)),
    }
    for name, func in kernels.items():
        ir = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        assert "load ptr, ptr @__TVMBackendAllocWorkspace" not in ir.inspect_source("ll"), name
