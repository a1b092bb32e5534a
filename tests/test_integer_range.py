"""Integer weights by CPU (``passes/integer_range``): ``auto`` keeps int8 where ONNX Runtime's u8 x s8 GEMM is exact
(VNNI, other architectures) and takes uint8 (or 7 bits beside int8 activations) where it saturates; the uint8 form
of the prompt graphs' integer GEMM computes the same exact integer products on any CPU."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from aotforge.core.errors import OptionsError
from aotforge.passes import integer_range
from aotforge.passes.integer_gemm import int8_per_column, integer_gemms
from aotforge.passes.integer_range import IntegerWeights, integer_weights
from tests.pass_models import _finish, run


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Pretend to be an x86-64 CPU with the flags given."""

    def pretend(*flags: str) -> None:
        integer_range.saturating_cpu.cache_clear()
        monkeypatch.setattr(integer_range.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(integer_range, "cpu_flags", lambda: set(flags))

    yield pretend
    integer_range.saturating_cpu.cache_clear()


@pytest.mark.parametrize("vnni", ["avx512_vnni", "avx_vnni"])
def test_auto_keeps_int8_weights_on_a_cpu_with_vnni(cpu, vnni: str) -> None:  # type: ignore[no-untyped-def]
    cpu("avx2", "avx512f", vnni)
    assert integer_weights("auto", "pass int8")[0] is IntegerWeights.INT8
    assert integer_weights("auto", "pass int8", signed_activations=True)[0] is IntegerWeights.INT8


def test_auto_avoids_saturation_on_an_x86_cpu_without_vnni(cpu) -> None:  # type: ignore[no-untyped-def]
    cpu("avx2", "fma")
    weights, why = integer_weights("auto", "pass int8-dynamic")
    assert weights is IntegerWeights.UINT8 and "no VNNI" in why
    assert integer_weights("auto", "pass int8", signed_activations=True)[0] is IntegerWeights.INT8_7BIT
    assert integer_weights("int8", "pass int8")[0] is IntegerWeights.INT8  # what the user asks for, as asked


def test_an_unknown_weight_type_is_refused_by_name() -> None:
    with pytest.raises(OptionsError, match="weights is one of auto, int8, int8-7bit, uint8"):
        integer_weights("int4", "pass int8-dynamic")


def test_uint8_integer_gemm_is_the_exact_integer_product() -> None:
    """Activations at the extremes of uint8 against weights at +-127: the pairs that saturate int16 in a u8 x s8
    kernel without VNNI. The uint8-weight graph's integer output equals numpy's exact int64 product."""
    k, n = 64, 32
    rng = np.random.default_rng(0)
    weight = rng.choice([-1.0, 1.0], size=(k, n)).astype(np.float32)  # every weight at +-127 once quantized
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = _finish(graph)
    assert integer_gemms(model, ["proj"], unsigned_weights=True) == ["proj"]
    gemm = next(node for node in model.graph if node.op_type == "MatMulInteger")
    gemm.outputs[0].name = "acc"
    model.graph.outputs.append(gemm.outputs[0])
    gemm.outputs[0].type = ir.TensorType(ir.DataType.INT32)
    gemm.outputs[0].shape = ir.Shape(["rows", n])
    x = np.where(np.sign(weight[:, :1].T) > 0, 1.0, -1.0).repeat(3, axis=0).astype(np.float32)  # all pairs same sign
    acc = run(model, {"x": x})[1]
    quantized, _ = int8_per_column(weight)
    exact = np.rint(x / (np.abs(x).max(axis=1, keepdims=True) / 127)).astype(np.int64) @ quantized.astype(np.int64)
    np.testing.assert_array_equal(acc, exact)
