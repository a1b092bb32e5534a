"""NaN through ReLU / Max / Min / Clip on tvm: ``fast_math=false`` gives what ONNX Runtime gives.

Before: TVM's compare-and-select ``maximum`` turned a NaN input into 0 (``max(NaN, 0)``), with or
without fast math, where ORT returns NaN; a NaN input left the tvm artifact as a finite output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import aotforge
from tests.in_process import ISOLATE_BACKEND

X = np.array([[np.nan, -np.nan, np.inf, -np.inf, 1, -1, 0, 2]], np.float32)


def _model(path: Path) -> Path:
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Relu", ["x"], ["relu"]),
        helper.make_node("Max", ["x", "zero"], ["max"]),
        helper.make_node("Min", ["x", "zero"], ["min"]),
        helper.make_node("Clip", ["x", "zero", "six"], ["clip"]),
    ]
    outputs = [vi(n, TensorProto.FLOAT, [1, 8]) for n in ("relu", "max", "min", "clip")]
    init = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("six", TensorProto.FLOAT, [], [6.0]),
    ]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 8])], outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_fast_math_false_propagates_nan_as_ort_does(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx")
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = dict(zip(("relu", "max", "min", "clip"), session.run(None, {"x": X}), strict=True))
    ieee = aotforge.build(
        str(model),
        target="tvm",
        out=tmp_path / "ieee",
        bench=False,
        target_options={"fast_math": "false"},
        isolate_backend=ISOLATE_BACKEND,
    )
    got = aotforge.load(ieee.path).run({"x": X})
    for name, want in expected.items():
        np.testing.assert_array_equal(np.isnan(got[name]), np.isnan(want), err_msg=name)
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[name][finite], want[finite], err_msg=name)
    info = json.dumps(ieee.manifest.target.info)
    assert '"fast_math": false' in info and "ieee_nan" in info and "nan_propagating" in info
    fast = aotforge.build(str(model), target="tvm", out=tmp_path / "fast", bench=False, isolate_backend=ISOLATE_BACKEND)
    assert np.isfinite(aotforge.load(fast.path).run({"x": X})["relu"][0, :2]).all()  # the default's documented cost
