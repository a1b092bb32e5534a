"""float8 / 4-bit casts through tvm as byte arithmetic (targets/tvm/importable/narrow.py).

The encoding tables are checked against ONNX's reference cast on every kind of float32 (random
magnitudes from 1e-12 to 1e8, subnormals, the saturation edges and ties, +/-inf, -0); the rewritten
graph against ONNX Runtime; one tvm build on the values TVM 0.27 got wrong (NaN, inf, saturation, -0).
The reference is onnx's (``onnx.reference``, IEEE rounding): where ONNX Runtime differs from it (480
cast to e4m3fn without saturation: ORT gives 448, the reference NaN) the artifact follows the reference.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from aotforge.targets.tvm.importable.narrow import NarrowTypesPass
from aotforge.targets.tvm.importable.narrow_encoding import _reference_bytes, encoding
from tests.in_process import ISOLATE_BACKEND

EDGES = np.array(
    [0.0, -0.0, np.inf, -np.inf, 448, 464, 470, -464, 57344, 61440, 65536, 1e-45, -1e-45, 2**-9, 2**-10, 1.5 * 2**-10],
    np.float32,
)


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    magnitudes = 10.0 ** rng.integers(-12, 8, 50_000)
    # 480 (e4m3fn's overflow tie): onnx's reference gives NaN without saturation (IEEE), ONNX Runtime 448
    ties = np.array([480, -480, 61440, 2**-10 * 1.5], np.float32)
    return np.concatenate([(rng.standard_normal(50_000) * magnitudes).astype(np.float32), EDGES, ties])


@pytest.mark.parametrize(
    ("target", "saturate", "round_mode"),
    [
        (T.FLOAT8E4M3FN, True, "up"),
        (T.FLOAT8E4M3FN, False, "up"),
        (T.FLOAT8E4M3FNUZ, False, "up"),
        (T.FLOAT8E5M2, False, "up"),
        (T.FLOAT8E5M2FNUZ, True, "up"),
        (T.FLOAT8E8M0, True, "nearest"),
    ],
)
def test_encoding_tables_are_the_reference_cast(target: int, saturate: bool, round_mode: str) -> None:
    x = _values()
    bounds, codes, _, (negative_zero, _) = encoding(target, saturate, round_mode)
    got = codes[np.searchsorted(bounds, x, side="right")]
    got = np.where((x == 0) & np.signbit(x), negative_zero, got)
    np.testing.assert_array_equal(got, _reference_bytes(x, target, saturate, round_mode))


def _model(saturate: int) -> onnx.ModelProto:
    """x (float32) -> float8 e4m3fn (an output) -> float16 (an output); b (int4) -> float."""
    nodes = [
        helper.make_node("Cast", ["x"], ["f8"], to=T.FLOAT8E4M3FN, saturate=saturate),
        helper.make_node("Cast", ["f8"], ["back"], to=T.FLOAT16),
        helper.make_node("Cast", ["b"], ["b_float"], to=T.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "narrow",
        [helper.make_tensor_value_info("x", T.FLOAT, [16]), helper.make_tensor_value_info("b", T.INT4, [16])],
        [
            helper.make_tensor_value_info("f8", T.FLOAT8E4M3FN, [16]),
            helper.make_tensor_value_info("back", T.FLOAT16, [16]),
            helper.make_tensor_value_info("b_float", T.FLOAT, [16]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _inputs() -> dict[str, np.ndarray]:
    x = EDGES.copy()
    x[-1] = np.nan
    return {"x": x, "b": np.arange(-8, 8).astype(ml_dtypes.int4)}


@pytest.mark.parametrize("saturate", [1, 0])
def test_rewritten_graph_computes_the_casts_on_bytes(saturate: int) -> None:
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    model = _model(saturate)
    expected = ReferenceEvaluator(model).run(None, _inputs())
    model, counts = _narrowed(model)
    assert counts == {"encode_float8e4m3fn": 1, "decode_float8e4m3fn": 1, "decode_int4": 1}
    assert {v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]} <= {
        T.FLOAT,
        T.FLOAT16,
        T.UINT8,
    }
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = {k: v.view(np.uint8) if v.dtype.itemsize == 1 else v for k, v in _inputs().items()}
    f8, back, b_float = session.run(None, inputs)
    np.testing.assert_array_equal(f8, np.asarray(expected[0]).view(np.uint8))
    np.testing.assert_array_equal(back, expected[1])
    np.testing.assert_array_equal(b_float, expected[2])


def _narrowed(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    import onnx_ir as ir

    step = NarrowTypesPass()
    result = step(ir.serde.deserialize_model(model))
    return ir.serde.serialize_model(result.model), step.stats


def test_a_float8_value_meeting_another_op_is_left_to_the_coverage_check() -> None:
    model = _model(1)
    model.graph.node.append(helper.make_node("Identity", ["f8"], ["copy"]))
    model.graph.output.append(helper.make_tensor_value_info("copy", T.FLOAT8E4M3FN, [16]))
    import onnx_ir as ir

    step = NarrowTypesPass()
    assert not step(ir.serde.deserialize_model(model)).modified and not step.stats

    from aotforge.targets.tvm.importable.coverage import check

    refused = check(ir.serde.deserialize_model(model), {"x": [16], "b": [16]}).refused
    assert any("float8 wrongly" in str(r) and "'copy'" in str(r) for r in refused), refused


def test_tvm_builds_float8_casts_that_match_the_reference(tmp_path: Path) -> None:
    import aotforge

    onnx.save(_model(0), tmp_path / "m.onnx")
    result = aotforge.build(
        str(tmp_path / "m.onnx"),
        target="tvm",
        sample_inputs=[_inputs()],
        bench=False,
        out=tmp_path / "out",
        isolate_backend=ISOLATE_BACKEND,
    )
    rewritten = result.manifest.target.info["coverage"]["rewritten"]
    assert rewritten["narrow_types"]["encode_float8e4m3fn"] == 1
    got = aotforge.load(result.path).run(_inputs())
    from onnx.reference import ReferenceEvaluator

    expected = ReferenceEvaluator(_model(0)).run(None, _inputs())
    assert got["f8"].dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(got["f8"].view(np.uint8), np.asarray(expected[0]).view(np.uint8))  # -0, NaN
    np.testing.assert_array_equal(got["back"], expected[1])
    np.testing.assert_array_equal(got["b_float"], expected[2])


def test_prepare_leaves_the_source_ir_unchanged() -> None:
    """The import steps change a copy: the float8 values of the IR they were given stay float8 (a second
    bucket's prepare narrows them again)."""
    import onnx_ir as ir

    from aotforge.targets.tvm.importable import prepare

    model = ir.serde.deserialize_model(_model(0))
    before = ir.serde.serialize_model(model).SerializeToString()
    reports = [prepare(model, {"x": [16], "b": [16]})[1] for _ in range(2)]
    assert reports[0]["narrow_types"] == reports[1]["narrow_types"] != {}
    assert ir.serde.serialize_model(model).SerializeToString() == before
