"""fp16 / bf16 conversion: it rewrites within tolerance and skips (idempotence: test_passes_idempotent)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

from aotforge.passes import make_pass
from aotforge.passes.convert_precision import ConvertPrecisionParams, ConvertToBFloat16Pass, ConvertToFloat16Pass
from aotforge.passes.manager import run_passes
from tests.pass_models import elementwise, feeds_for, mlp, rel_l2, run


def _dtypes_into(model: ir.Model, op_type: str) -> set[ir.DataType | None]:
    return {v.dtype for n in model.graph if n.op_type == op_type for v in n.inputs if v is not None}


def test_fp16_rewrites_within_tolerance_keeping_sensitive_ops_fp32() -> None:
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    records = run_passes(model, [ConvertToFloat16Pass()])
    assert records[0].stats["nodes_converted"] == 4
    assert records[0].changes_numerics
    assert _dtypes_into(model, "MatMul") == {ir.DataType.FLOAT16}
    assert _dtypes_into(model, "Softmax") == {ir.DataType.FLOAT}
    assert ir.DataType.FLOAT in _dtypes_into(model, "LayerNormalization")
    assert [v.dtype for v in [*model.graph.inputs, *model.graph.outputs]] == [ir.DataType.FLOAT] * 2
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert rel_l2(run(model, feeds)[0], expected) < 2e-3


def test_bf16_rewrites_within_tolerance() -> None:
    # ONNX Runtime's CPU provider has almost no bf16 kernels; the reference evaluator runs them.
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    run_passes(model, [ConvertToBFloat16Pass()])
    assert _dtypes_into(model, "MatMul") == {ir.DataType.BFLOAT16}
    actual = list(ReferenceEvaluator(ir.serde.serialize_model(model)).run(None, feeds))[0]
    assert rel_l2(np.asarray(actual, np.float32), expected) < 2e-2


def test_fp16_io_types_and_keep_list_are_configurable() -> None:
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    pass_ = make_pass("fp16", {"keep_io_types": "false", "keep_fp32_ops": "LayerNormalization"})
    run_passes(model, [pass_])
    assert [v.dtype for v in [*model.graph.inputs, *model.graph.outputs]] == [ir.DataType.FLOAT16] * 2
    assert _dtypes_into(model, "Softmax") == {ir.DataType.FLOAT16}
    actual = run(model, {k: v.astype(np.float16) for k, v in feeds.items()})[0]
    assert rel_l2(actual, expected) < 5e-3


@pytest.mark.parametrize("cls", [ConvertToFloat16Pass, ConvertToBFloat16Pass])
def test_skips_when_every_op_is_kept(cls: type) -> None:
    model = elementwise()
    pass_ = cls(ConvertPrecisionParams(keep_fp32_ops=("Softmax", "Mul")))
    assert not pass_(model).modified
    assert pass_.stats["nodes_converted"] == 0
