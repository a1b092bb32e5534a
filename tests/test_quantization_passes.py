"""INT8 dynamic and static (QDQ) quantization: rewrites within tolerance, skips (idempotence: test_passes_idempotent).

The accuracy budget: ``test_quantization_budget``; int8-dynamic's options: ``test_quantize_dynamic_options``,
its QAttention: ``test_quantize_dynamic_attention``; static activations: ``test_quantize_static_activations``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from aotforge.core.errors import OptionsError
from aotforge.passes import make_pass
from aotforge.passes.manager import run_passes
from aotforge.passes.ort_quantization import op_counts
from aotforge.passes.quantize_dynamic import QuantizeDynamicPass
from aotforge.passes.quantize_static import QuantizeStaticParams, QuantizeStaticPass
from tests.pass_models import INT8_REL_L2, cnn, elementwise, feeds_for, mlp, rel_l2, run


def test_int8_dynamic_rewrites_matmuls_within_tolerance() -> None:
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    records = run_passes(model, [make_pass("int8-dynamic", {"per_channel": "true"})])
    assert records[0].stats["nodes_quantized"] == 2
    assert op_counts(model)["MatMulInteger"] == 2
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_int8_static_rewrites_to_qdq_within_tolerance(method: str) -> None:
    model = cnn()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    records = run_passes(model, [make_pass("int8", {"method": method, "samples": "8"})])
    stats = records[0].stats
    assert stats["ops"]["Conv"] == 2 and stats["calibration_samples"] == 8
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(op_counts(model))
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


def test_int8_static_calibrates_from_a_directory(tmp_path: Path) -> None:
    model = mlp()
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "a.npz", x=rng.standard_normal((5, 4, 32)).astype(np.float32))  # a stack of 5
    np.save(tmp_path / "b.npy", rng.standard_normal((4, 32)).astype(np.float32))  # one sample
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    pass_ = QuantizeStaticPass(QuantizeStaticParams(calibration_dir=str(tmp_path), nodes_to_exclude=("softmax",)))
    run_passes(model, [pass_])
    assert pass_.stats["calibration_samples"] == 6
    assert "Softmax" not in pass_.stats["ops"]
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


def test_int8_static_rejects_bad_options(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="minmax, entropy, percentile"):
        make_pass("int8", {"method": "median"})
    np.savez(tmp_path / "a.npz", tokens=np.zeros((4, 32), np.float32))
    with pytest.raises(OptionsError, match="name the arrays .* after the inputs"):
        QuantizeStaticPass(QuantizeStaticParams(calibration_dir=str(tmp_path)))(mlp())


def test_skips_model_without_matmuls() -> None:
    model = elementwise()
    pass_ = QuantizeDynamicPass()
    assert not pass_(model).modified
    assert pass_.stats["skipped"] == "no node to quantize"


@pytest.mark.parametrize("first", [QuantizeStaticPass, QuantizeDynamicPass])
def test_skips_already_quantized_model(first: type) -> None:
    model = mlp()
    first()(model)
    before = ir.serde.serialize_model(model).SerializeToString()
    for cls in (QuantizeStaticPass, QuantizeDynamicPass):
        pass_ = cls()
        assert not pass_(model).modified
        assert "already quantized" in pass_.stats["skipped"]
    assert ir.serde.serialize_model(model).SerializeToString() == before
