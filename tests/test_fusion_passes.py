"""Fusion passes (fuse-conv-bn, fuse, fuse-ort): rewrite, skip, idempotent, numerics; contrib-op refusal."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from aotforge.core.errors import UnsupportedModelError
from aotforge.core.spec import IOSpec, TensorSpec
from aotforge.passes import PRESETS, contrib_op_passes, make_pass
from aotforge.passes.fuse_conv_batchnorm import FuseConvBatchNormPass
from aotforge.passes.fuse_patterns import FuseOrtPass, FusePatternsPass, contrib_domains, op_histogram
from aotforge.passes.manager import run_passes
from aotforge.targets.base import BuildContext
from aotforge.targets.onnxruntime import OrtOptions, OrtTarget
from aotforge.targets.tvm.options import TvmOptions
from aotforge.targets.tvm.target import TvmTarget
from tests.pass_models import conv_bn, decomposed_layer_norm, elementwise, feeds_for, mlp, run

CASES = [
    ("fuse-conv-bn", conv_bn, {"BatchNormalization": -1}),
    ("fuse", decomposed_layer_norm, {"LayerNormalization": 1, "ReduceMean": -2}),
    ("fuse", mlp, {"Gemm": 1, "MatMul": -1}),
    ("fuse-ort", lambda: decomposed_layer_norm(residual=True), {"com.microsoft::SkipLayerNormalization": 1}),
]


def _bytes(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


@pytest.mark.parametrize(("name", "make_model", "delta"), CASES)
def test_fusion_rewrites_within_tolerance(name: str, make_model, delta: dict[str, int]) -> None:
    model = make_model()
    feeds = feeds_for(model)
    expected = run(model, feeds)
    before = op_histogram(model)
    pass_ = make_pass(name)
    records = run_passes(model, [pass_])
    after = op_histogram(model)
    for op, change in delta.items():
        assert after.get(op, 0) - before.get(op, 0) == change, (op, records[0].stats)
    assert sum(records[0].stats["fused"].values()) >= 1
    for got, want in zip(run(model, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=type(pass_).tolerance, rtol=type(pass_).tolerance)


@pytest.mark.parametrize("cls", [FuseConvBatchNormPass, FusePatternsPass, FuseOrtPass])
def test_skips_model_with_nothing_to_fuse(cls: type) -> None:
    model = elementwise()
    before = _bytes(model)
    pass_ = cls()
    assert not pass_(model).modified
    assert not any(pass_.stats["fused"].values())
    assert _bytes(model) == before


@pytest.mark.parametrize(("name", "make_model", "delta"), CASES)
def test_idempotent(name: str, make_model, delta: dict[str, int]) -> None:
    model = make_model()
    make_pass(name)(model)
    once = _bytes(model)
    assert not make_pass(name)(model).modified
    assert _bytes(model) == once


def test_fuse_ort_emits_contrib_ops_and_o2_does_not() -> None:
    model = decomposed_layer_norm(residual=True)
    run_passes(model, [make_pass(n) for n in PRESETS["O2"]])
    assert not contrib_domains(model)
    FuseOrtPass()(model)
    assert contrib_domains(model) == {"com.microsoft"}


def _ctx(passes: tuple[str, ...]) -> BuildContext:
    return BuildContext(
        io=IOSpec(inputs=(TensorSpec("x", "float32", (2, 8, 16)),), outputs=()),
        passes=passes,
        contrib_passes=contrib_op_passes(passes),
    )


def test_tvm_refuses_contrib_ops_by_name_at_planning() -> None:
    with pytest.raises(UnsupportedModelError, match="tvm cannot honour pass 'fuse-ort'"):
        TvmTarget().plan(decomposed_layer_norm(), TvmOptions(), _ctx(("fuse-ort",)))
    fused = decomposed_layer_norm(residual=True)
    FuseOrtPass()(fused)
    with pytest.raises(UnsupportedModelError, match="com.microsoft"):
        TvmTarget().plan(fused, TvmOptions(), _ctx(()))
    TvmTarget().plan(decomposed_layer_norm(), TvmOptions(), _ctx(("fuse", "int8", "bf16")))  # these import


def test_onnxruntime_cpu_refuses_bf16_but_runs_contrib_ops() -> None:
    with pytest.raises(UnsupportedModelError, match="cannot run pass 'bf16'"):
        OrtTarget().plan(mlp(), OrtOptions(), _ctx(("bf16",)))
    OrtTarget().plan(mlp(), OrtOptions(), _ctx(("fuse-ort", "int8")))
