"""The tensorrt target: everything that runs without TensorRT is tested for real here (its engine
compatibility checks: tests/test_tensorrt_compat.py; its layer report: tests/test_tensorrt_report.py).

The end-to-end test at the bottom needs TensorRT and an NVIDIA GPU and skips elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotforge.core.dim_defaults import resolve_dims
from aotforge.core.errors import ArtifactError, InputSpecError, OptionsError, TargetUnavailableError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import DimRange, IOSpec, TensorSpec
from aotforge.core.target_record import TargetRecord
from aotforge.targets import get_target
from aotforge.targets.base import BuildContext
from aotforge.targets.tensorrt.compat import HardwareCompat
from aotforge.targets.tensorrt.target import (
    TensorRTOptions,
    TensorRTTarget,
    _check_profile,
    build_plan,
    builder_flags,
    check_graph_inputs,
    check_qdq,
    plan_profiles,
    prepare_onnx,
)

IMAGE = IOSpec(
    inputs=(TensorSpec("x", "float32", ("batch", 3, 8, 8)),),
    outputs=(TensorSpec("y", "float32", ("batch", 4)),),
    dims=(DimRange("batch", 1, 4, 16),),
)


def _qdq_fp16_model(batch_dim: str | int = "batch") -> ir.Model:
    """A small conv net with explicit Q/DQ and an fp16 section, as the passes would leave it."""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["c"], ["c16"], to=TensorProto.FLOAT16),
        helper.make_node("Relu", ["c16"], ["r16"]),
        helper.make_node("Cast", ["r16"], ["r"], to=TensorProto.FLOAT),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 4])],
        [w, scale, zero],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))


def test_profiles_follow_declared_ranges() -> None:
    (profile,) = plan_profiles(IMAGE)
    assert (profile.min, profile.opt, profile.max) == ((1, 3, 8, 8), (4, 3, 8, 8), (16, 3, 8, 8))


def test_profiles_use_the_resolved_ranges_never_a_silent_one() -> None:
    spec = IOSpec(
        inputs=(TensorSpec("ids", "int64", ("batch", "seq")),), outputs=(), dims=(DimRange("seq", 8, 64, 128),)
    )
    with pytest.raises(InputSpecError, match="dims batch have no declared range"):
        plan_profiles(spec)
    (profile,) = plan_profiles(resolve_dims(spec, spec.dims))  # batch: the documented default 1:1:8
    assert profile.min == (1, 8) and profile.opt == (1, 64) and profile.max == (8, 128)


def test_profile_refuses_misordered_range_naming_input_and_dim() -> None:
    with pytest.raises(InputSpecError, match=r"input 'x' dim 0 needs 1 <= min <= opt <= max, got 8, 4, 16"):
        _check_profile("x", (8, 3), (4, 3), (16, 3))
    with pytest.raises(InputSpecError, match="reorder"):
        DimRange("batch", 4, 2, 8)


def test_profile_refuses_non_positive_fixed_dim() -> None:
    spec = IOSpec(inputs=(TensorSpec("x", "float32", (0, 3)),), outputs=())
    with pytest.raises(InputSpecError, match="fixed dim 0"):
        plan_profiles(spec)


def test_graph_with_fixed_batch_refuses_a_dynamic_spec() -> None:
    check_graph_inputs(_qdq_fp16_model(), IMAGE)
    with pytest.raises(InputSpecError, match="dim 0 is fixed to 1 in the IR but the spec says 'batch'"):
        check_graph_inputs(_qdq_fp16_model(batch_dim=1), IMAGE)


def test_flags_map_sparsity_and_version_compat_but_never_precision() -> None:
    assert builder_flags(TensorRTOptions(), ("fold_constants", "fp16", "int8")) == ()
    assert builder_flags(TensorRTOptions(), ("sparsity24",)) == ("SPARSE_WEIGHTS",)
    assert builder_flags(TensorRTOptions(version_compatible=True), ()) == ("VERSION_COMPATIBLE",)
    # TF32 stays cleared (fp32 layers validate as fp32) unless asked for.
    assert builder_flags(TensorRTOptions(tf32=True), ()) == ("TF32",)


def test_cuda_graphs_and_tf32_options_parse_from_cli_strings() -> None:
    parsed = options_from_dict(TensorRTOptions, {"cuda_graphs": "false", "tf32": "true"}, what="tensorrt")
    assert parsed.cuda_graphs is False and parsed.tf32 is True
    assert TensorRTOptions().cuda_graphs is True and TensorRTOptions().tf32 is False


@pytest.mark.parametrize(
    ("trt_name", "array"),
    [
        ("FLOAT", np.array([[1.5, -2.0]], np.float32)),
        ("HALF", np.array([0.5, 3.0], np.float16)),
        ("INT64", np.array(7, np.int64)),  # 0-d stays 0-d
        ("BOOL", np.array([True, False])),
        ("BF16", np.array([1.0, -3.5, float("nan")], dtype="bfloat16")),
        ("FP8", np.array([0.5, -2.0, 448.0], dtype="float8_e4m3fn")),
    ],
)
def test_io_types_cross_through_torch_and_back_exactly(trt_name: str, array: np.ndarray) -> None:
    # What trt.nptype cannot do (no bfloat16 / float8): the runner's types come from torch.
    from aotforge.targets.tensorrt.runner import to_numpy, to_torch, torch_dtype

    dtype = torch_dtype(trt_name)
    tensor = to_torch(array, dtype)
    assert tensor.dtype == dtype and tuple(tensor.shape) == array.shape
    back = to_numpy(tensor)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()  # bit for bit, NaN included


def test_an_io_type_without_a_torch_type_is_refused_by_name() -> None:
    from aotforge.targets.tensorrt.runner import torch_dtype

    with pytest.raises(ArtifactError, match="I/O type INT4"):
        torch_dtype("INT4")


def test_options_from_cli_strings_and_refusals() -> None:
    opts = options_from_dict(
        TensorRTOptions,
        {"hardware_compatibility": "ampere_plus", "version_compatible": "true", "workspace_mb": "512"},
        what="tensorrt",
    )
    assert opts.hardware_compatibility is HardwareCompat.AMPERE_PLUS and opts.version_compatible
    plan = build_plan(opts, BuildContext(io=IMAGE, passes=("sparsity24",)))
    assert plan.workspace_bytes == 512 << 20 and plan.flags == ("SPARSE_WEIGHTS", "VERSION_COMPATIBLE")
    assert json.loads(json.dumps(plan.to_dict()))["profiles"][0]["max"] == [16, 3, 8, 8]
    with pytest.raises(OptionsError, match="hardware_compatibility"):
        TensorRTOptions(hardware_compatibility="turing")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="0-5"):
        TensorRTOptions(builder_optimization_level=7)
    with pytest.raises(OptionsError, match="unknown tensorrt option"):
        options_from_dict(TensorRTOptions, {"fp16": "true"}, what="tensorrt")


def test_onnx_for_the_parser_passes_checker_and_keeps_qdq_and_fp16(tmp_path: Path) -> None:
    path = prepare_onnx(_qdq_fp16_model(), tmp_path)
    saved = onnx.load(str(path))
    onnx.checker.check_model(saved)
    ops = [n.op_type for n in saved.graph.node]
    assert ops.count("QuantizeLinear") == 1 and ops.count("DequantizeLinear") == 1
    assert any(n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16 for n in saved.graph.node)
    assert saved.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_onnx_that_fails_checker_is_refused_before_the_parser(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(tmp_path / "model.onnx"))
    with pytest.raises(InputSpecError, match="fails onnx.checker"):
        prepare_onnx(_qdq_fp16_model(), tmp_path)  # the file on disk is what the parser would read


def test_probe_names_what_this_host_lacks_and_compile_refuses(tmp_path: Path) -> None:
    target = get_target("tensorrt")
    probe = target.probe()
    if probe.available:
        pytest.skip("this host has TensorRT and a GPU")
    assert not probe.compiles
    named = ["python package 'tensorrt'", "libnvinfer", "GPU"]
    assert any(n in probe.reason for n in named), probe.reason
    import torch

    if not torch.cuda.is_available():  # the runner's buffers are CUDA tensors: a CPU torch is named too
        assert "torch" in probe.reason and torch.__version__ in probe.reason, probe.reason
    ctx = BuildContext(io=IMAGE)
    with pytest.raises(TargetUnavailableError, match="build on an NVIDIA host"):
        target.compile(_qdq_fp16_model(), TensorRTOptions(), ctx, tmp_path)
    assert not (tmp_path / "model.engine").exists()


def _reference(model: ir.Model, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "plain"])
def test_end_to_end_engine_builds_loads_and_matches_ort(tmp_path: Path, cuda_graphs: bool) -> None:
    target = get_target("tensorrt")
    probe = target.probe()
    if not probe.available:
        pytest.skip(probe.reason)
    model, ctx = _qdq_fp16_model(), BuildContext(io=IMAGE)
    options = TensorRTOptions(timing_cache=str(tmp_path / "cache" / "timing.bin"), cuda_graphs=cuda_graphs)
    result = target.compile(model, options, ctx, tmp_path)
    assert result.target_info["timing_cache_sha256"] and result.target_info["layers"]["layer_count"] > 0
    runner = target.load(tmp_path, TargetRecord("tensorrt", info=dict(result.target_info)), IMAGE)
    for batch in (1, 4, 16, 4, 1):  # back to shapes already bound: their buffers (and graphs) are reused
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(runner.run({"x": x})["y"], _reference(model, x), rtol=2e-2, atol=2e-2)
        assert getattr(runner, "device_ms", 0) > 0  # CUDA-event GPU time of the call
    assert len(getattr(runner, "slots", {})) == 3
    with pytest.raises(InputSpecError, match="outside the engine's profile"):
        runner.run({"x": np.zeros((17, 3, 8, 8), np.float32)})


def test_timing_cache_lives_in_the_build_cache_per_version_and_gpu(tmp_path: Path) -> None:
    target = TensorRTTarget()
    chosen = target.with_cache_dir(TensorRTOptions(), tmp_path)
    path = Path(chosen.timing_cache)
    assert path.parent == tmp_path / "timing"
    assert path.name.startswith("tensorrt-") and "-cc" in path.name and path.name.endswith(".timing")
    given = TensorRTOptions(timing_cache=str(tmp_path / "mine.bin"))
    assert target.with_cache_dir(given, tmp_path) is given


def test_qdq_tensorrt_cannot_build_is_refused_by_node() -> None:
    from aotforge.core.errors import UnsupportedModelError

    check_qdq(_qdq_fp16_model())  # signed int8, zero point 0: what TensorRT builds
    model = _qdq_fp16_model()
    zero = model.graph.initializers["z"]
    zero.const_value = ir.tensor(np.array(3, np.int8))
    with pytest.raises(UnsupportedModelError, match="int8 zero point that is not 0"):
        check_qdq(model)
    zero.const_value = ir.tensor(np.array(128, np.uint8))
    zero.dtype = ir.DataType.UINT8
    with pytest.raises(UnsupportedModelError, match="uint8 zero point.*int8.activations=int8"):
        check_qdq(model)
