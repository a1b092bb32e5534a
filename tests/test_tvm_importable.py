"""The ONNX-level steps in front of tvm's importer (targets/tvm/importable), each on its own.

Every case is an ONNX node-suite model (constants variant: shape-like inputs bound): the prepared
graph must compute what the source computes (ONNX Runtime on both, the case's own data), say which
step changed it, and be accepted by TVM's Relax importer; no compile, so each takes well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from aotforge.targets.tvm.target import _as_bytes, _from_bytes
from tests.test_node_suite import _tool

#: case -> (report key, what it names): one case per expansion, unrolling and legalization rule.
CASES = {
    "test_sce_mean": ("expanded", "SoftmaxCrossEntropyLoss"),
    "test_nllloss_NCd1_weight": ("expanded", "NegativeLogLikelihoodLoss"),
    "test_attention_3d_gqa": ("expanded", "Attention"),
    "test_rotary_embedding": ("expanded", "RotaryEmbedding"),
    "test_rms_normalization_2d_axis0": ("expanded", "RMSNormalization"),
    "test_layer_normalization_2d_axis0": ("expanded", "LayerNormalization"),
    "test_spacetodepth_crd_mode_example": ("expanded", "SpaceToDepth"),
    "test_swish": ("expanded", "Swish"),
    "test_linear_attention_linear": ("unrolled", "Scan"),
    "test_scan9_sum": ("unrolled", "Scan"),
    "test_range_int32_type_negative_delta_expanded": ("unrolled", "Loop"),
    "test_expand_dim_changed": ("legalized", "expand_against_ones"),
    "test_bitshift_left_int32_shift_ge_width": ("legalized", "shift_left_out_of_range"),
    "test_bitshift_left_int32_negative_shift": ("legalized", "shift_left_out_of_range"),
    "test_cosh": ("legalized", "sinh_by_exp"),
    "test_isinf_negative": ("legalized", "isinf_one_sign"),
    "test_convtranspose_output_shape": ("legalized", "conv_transpose_output_shape"),
    "test_pow_types_int64_int64": ("legalized", "pow_mixed_types"),
    "test_pow_types_float32_int32": ("legalized", "pow_mixed_types"),
    "test_sinh": ("legalized", "sinh_by_exp"),
    "test_l2normalization_axis_0": ("legalized", "lp_normalization"),
    "test_cumprod_2d_axis_0": ("legalized", "cum_prod"),
    "test_cumprod_1d_reverse_exclusive": ("legalized", "cum_prod"),
    "test_onehot_negative_indices": ("legalized", "one_hot"),
    "test_reduce_max_bool_inputs": ("legalized", "reduce_bool"),
    "test_reduce_max_empty_set": ("legalized", "reduce_empty_set"),
    "test_reduce_min_empty_set": ("legalized", "reduce_empty_set"),
    "test_resize_upsample_sizes_nearest_axes_2_3": ("legalized", "resize_full_rank"),
    "test_resize_upsample_scales_nearest_axes_3_2": ("legalized", "resize_full_rank"),
    "test_resize_downsample_sizes_nearest_not_larger": ("legalized", "resize_full_rank"),
    "test_resize_tf_crop_and_resize_axes_3_2": ("legalized", "resize_full_rank"),
    "test_celu_float16": ("legalized", "elu_in_float32"),
    "test_batchnorm_example_training_mode": ("legalized", "batch_norm_training"),
    "test_reversesequence_batch": ("legalized", "reverse_sequence"),
    "test_upsample_nearest": ("legalized", "upsample_nearest"),
    "test_eyelike_with_dtype": ("legalized", "eye_like_dtype"),
    "test_qlinearmatmul_3D_int8_float16": ("legalized", "qlinear_matmul"),
    "test_col2im_pads": ("legalized", "col2im"),
    "test_col2im_5d": ("legalized", "col2im"),
    "test_split_zero_size_splits_opset18": ("legalized", "split_empty_parts"),
    "test_bitcast_uint16_to_int16": ("legalized", "bitcast"),
    "test_bitcast_float64_to_int64": ("legalized", "bitcast"),
    "test_bitcast_int32_to_float32": ("legalized", "bitcast"),
    "test_simple_rnn_reverse": ("legalized", "recurrent"),
    "test_gru_bidirectional": ("legalized", "recurrent"),
    "test_lstm_with_peepholes": ("legalized", "recurrent"),  # sequence_lens a graph input: masked steps
    "test_resize_downsample_scales_cubic_antialias": ("legalized", "resize_by_taps"),
    "test_resize_upsample_scales_linear_half_pixel_symmetric": ("legalized", "resize_by_taps"),
    "test_resize_downsample_sizes_nearest_not_smaller": ("legalized", "resize_by_taps"),
    "test_cast_FLOAT_to_FLOAT8E4M3FN": ("narrow_types", "encode_float8e4m3fn"),
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2": ("narrow_types", "encode_float8e5m2"),
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ": ("narrow_types", "encode_float8e4m3fnuz"),
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0": ("narrow_types", "encode_float8e8m0"),
    "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded": ("narrow_types", "decode_float8e5m2fnuz"),
    "test_cast_INT4_to_FLOAT16": ("narrow_types", "decode_int4"),
    "test_cast_UINT2_to_UINT8": ("narrow_types", "decode_uint2"),
    "test_shape_start_1_end_2": ("constants_as_tensors", None),
}


@pytest.fixture(scope="module")
def suite() -> Any:
    return _tool()


@pytest.fixture(scope="module")
def cases(suite: Any) -> dict[str, Any]:
    return {
        c.name: c
        for c in suite.collect(
            "|".join(f"^{n}$" for n in [*CASES, "test_relu", "test_layer_normalization_2d_axis0_expanded"])
        )
    }


def _prepared(case: Any) -> tuple[onnx.ModelProto, dict[str, Any], dict[str, list[Any]]]:
    from aotforge.targets.tvm.importable import prepare

    model = onnx.load(case.model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    proto, report = prepare(ir.serde.deserialize_model(model), shapes)
    return proto, report, shapes


def _same_outputs(suite: Any, case: Any, proto: onnx.ModelProto) -> None:
    import onnxruntime as ort

    from aotforge.targets.onnxruntime.session_io import run_session

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names, outputs = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]
    # float8 / 4-bit / 2-bit values cross as their bytes once prepared (importable/narrow.py)
    inputs = [_as_bytes(np.asarray(v)) for v in case.inputs[0]]
    got = run_session(session, outputs, dict(zip(names, inputs, strict=True)))
    expected = case.expected[0]
    values = [_from_bytes(got[n], str(np.asarray(e).dtype)) for n, e in zip(outputs, expected, strict=True)]
    suite.check_outputs(case, 0, values)


@pytest.mark.parametrize("name", list(CASES))
def test_step_rewrites_into_what_the_importer_takes(
    suite: Any, cases: dict[str, Any], tmp_path: Path, name: str
) -> None:
    from tvm.relax.frontend.onnx import from_onnx

    case = suite.write_case(cases[name], tmp_path, "constants")
    proto, report, shapes = _prepared(case)
    key, what = CASES[name]
    assert report.get(key) and (what is None or what in report[key]), report
    _same_outputs(suite, case, proto)
    from_onnx(proto, shape_dict=shapes)


@pytest.mark.parametrize("name", ["test_relu", "test_layer_normalization_2d_axis0_expanded"])
def test_skips_what_the_importer_takes(suite: Any, cases: dict[str, Any], tmp_path: Path, name: str) -> None:
    case = suite.write_case(cases[name], tmp_path, "constants")
    proto, report, _ = _prepared(case)
    assert not report, report


@pytest.mark.parametrize("name", ["test_sce_mean", "test_cumprod_2d_axis_0", "test_scan9_sum"])
def test_idempotent(suite: Any, cases: dict[str, Any], tmp_path: Path, name: str) -> None:
    from aotforge.targets.tvm.importable import prepare

    case = suite.write_case(cases[name], tmp_path, "constants")
    proto, report, shapes = _prepared(case)
    _, again = prepare(ir.serde.deserialize_model(proto), shapes)
    assert report and not again, again


def test_wrong_bodies_are_not_picked_by_opset() -> None:
    """The body of an op is the newest at or below the model's opset (ReduceMean's axes moved to an input at 18)."""
    from aotforge.targets.tvm.importable.expand import function_body

    node = onnx.helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], axis=-1)
    float_2d = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [2, 3])
    for opset, axes_as_input in ((17, False), (18, True)):
        body = function_body(node, opset, {"x": float_2d, "s": float_2d})
        assert body is not None
        reduce = next(n for n in body.node if n.op_type == "ReduceMean")
        assert (len(reduce.input) == 2) == axes_as_input, (opset, reduce)
    assert function_body(onnx.helper.make_node("Relu", ["x"], ["y"]), 18, {}) is not None
    assert function_body(onnx.helper.make_node("Conv", ["x", "w"], ["y"]), 13, {}) is None


def test_check_command_names_what_tvm_takes_and_what_it_cannot(suite: Any, tmp_path: Path) -> None:
    """``aotforge check`` in seconds: expansions reported, a node tvm cannot take named, exit 1."""
    import json

    from click.testing import CliRunner

    from aotforge.compiler.cli import main

    paths = {}
    for name in ("test_sce_mean", "test_det_2d"):
        (case,) = suite.collect(f"^{name}$")
        paths[name] = str(suite.write_case(case, tmp_path, "constants").model)
    good = CliRunner().invoke(main, ["check", paths["test_sce_mean"], "--json"])
    assert good.exit_code == 0, good.output
    assert json.loads(good.output)["rewritten"]["expanded"]["SoftmaxCrossEntropyLoss"] == 1
    bad = CliRunner().invoke(main, ["check", paths["test_det_2d"]])
    assert bad.exit_code == 1 and "cannot take ai.onnx::Det-22" in bad.output, bad.output


def _one_node_model(node: onnx.NodeProto, inputs: list[Any], inits: list[onnx.TensorProto], opset: int) -> ir.Model:
    helper = onnx.helper
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(node.output[-1], 0, None)], inits)
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def test_partial_rewrites_refuse_what_they_cannot_make_exact() -> None:
    """An LSTM with a graph-input weight, a QLinearMatMul with per-row scales, a float16 BitCast: refused at
    planning with the op and why, never an artifact."""
    from aotforge.targets.tvm.importable.coverage import check

    helper, f32, u8 = onnx.helper, onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8
    value = helper.make_tensor_value_info
    lstm = helper.make_node("LSTM", ["x", "w", "r"], ["", "h"], hidden_size=2)
    rw = numpy_helper_array(np.zeros((1, 8, 2), np.float32), "r")
    models = {
        "LSTM": _one_node_model(lstm, [value("x", f32, [3, 1, 2]), value("w", f32, [1, 8, 2])], [rw], 22),
        "QLinearMatMul": _one_node_model(
            helper.make_node("QLinearMatMul", ["a", "s", "z", "b", "t", "z", "t", "z"], ["y"]),
            [value("a", u8, [2, 2]), value("b", u8, [2, 2])],
            [numpy_helper_array(np.ones(2, np.float32), "s"), numpy_helper_array(np.ones(1, np.float32), "t")]
            + [numpy_helper_array(np.zeros(1, np.uint8), "z")],
            21,
        ),
        "BitCast": _one_node_model(
            helper.make_node("BitCast", ["x"], ["y"], to=onnx.TensorProto.INT16),
            [value("x", onnx.TensorProto.FLOAT16, [2])],
            [],
            26,
        ),
    }
    for op, model in models.items():
        shapes = {v.name: list(v.shape or []) for v in model.graph.inputs}
        refused = check(model, shapes).refused
        assert [r.op for r in refused] == [op] and "aotforge's rewrite: " in refused[0].reason, refused


def test_resize_taps_skip_what_tvm_computes_right() -> None:
    """Upsampling linear by 2 (output / input is the scale) stays a Resize for TVM's own kernel, and the report
    says why each rule left it alone."""
    from aotforge.targets.tvm.importable import prepare

    helper = onnx.helper
    resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    scales = numpy_helper_array(np.array([1, 1, 2, 2], np.float32), "scales")
    model = _one_node_model(resize, [helper.make_tensor_value_info("x", 1, [1, 1, 3, 3])], [scales], 19)
    proto, report = prepare(model, {"x": [1, 1, 3, 3]})
    assert [n.op_type for n in proto.graph.node] == ["Resize"] and list(report["legalized"]) == ["declined"], report
    assert report["legalized"]["declined"] == {
        "resize_by_taps: TVM's resize is right here": 1,
        "resize_full_rank: neither axes nor a keep_aspect_ratio_policy": 1,
    }


def numpy_helper_array(value: np.ndarray, name: str) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(value, name)


def test_reduce_of_all_minus_infinity_rows() -> None:
    """A ReduceMax row of only -inf (an attention row fully masked) gives -inf once prepared."""
    import onnxruntime as ort

    from aotforge.targets.tvm.importable import prepare

    helper = onnx.helper
    axes = numpy_helper_array(np.array([1], np.int64), "axes")
    reduce = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)
    model = _one_node_model(reduce, [helper.make_tensor_value_info("x", 1, [2, 3])], [axes], 18)
    proto, report = prepare(model, {"x": [2, 3]})
    assert report["legalized"] == {
        "reduce_extreme_infinity": 1,
        "declined": {"reduce_bool: not bool": 1, "reduce_empty_set: no reduced axis of size 0": 1},
    }, report
    x = np.array([[-np.inf] * 3, [1, -np.inf, 2]], np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], [-np.inf, 2])


@pytest.mark.parametrize(("source", "target"), [("float32", "int32"), ("float64", "int64"), ("uint32", "float32")])
def test_bitcast_float_bits_exactly(source: str, target: str) -> None:
    """Edge values keep their bits both ways: subnormals, the extremes, infinities, -0; NaN stays NaN."""
    import onnxruntime as ort

    from aotforge.targets.tvm.importable import prepare

    helper = onnx.helper
    floats = np.array([1.0, -2.5, 0.0, -0.0, np.inf, -np.inf, 1e-45, -3e-39, 3.4e38, 1e-310, 1.7e308, 0.1], np.float64)
    rng = np.random.default_rng(0)
    width = np.dtype(source).itemsize
    bits = np.dtype(f"uint{8 * width}")
    with np.errstate(over="ignore"):
        edges = floats.astype(f"float{8 * width}").view(bits)
    x = np.concatenate([edges, rng.integers(0, np.iinfo(bits).max, 64, dtype=bits, endpoint=True)]).view(source)
    x = x[~np.isnan(x)] if x.dtype.kind == "f" else x
    to = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    node = helper.make_node("BitCast", ["x"], ["y"], to=to)
    model = _one_node_model(
        node, [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), [len(x)])], [], 26
    )
    proto, report = prepare(model, {"x": [len(x)]})
    assert {k: v for k, v in report["legalized"].items() if k != "declined"} == {"bitcast": 1}, report
    got = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    expected = x.view(target)
    if expected.dtype.kind == "f":
        nan = np.isnan(expected)
        assert (np.isnan(got) == nan).all()
        np.testing.assert_array_equal(got[~nan].view(f"uint{8 * width}"), expected[~nan].view(f"uint{8 * width}"))
    else:
        np.testing.assert_array_equal(got, expected)
