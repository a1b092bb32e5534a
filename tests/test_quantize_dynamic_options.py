"""int8-dynamic's options: exclusions that must apply, smoothing of outlier channels, splitting
SkipLayerNormalization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aotforge.core.errors import OptionsError
from aotforge.passes import make_pass
from aotforge.passes import quantize_prepare as prep
from aotforge.passes.quantize_dynamic import QuantizeDynamicParams, QuantizeDynamicPass
from tests import quant_models
from tests.pass_models import INT8_REL_L2, feeds_for, mlp, rel_l2, run
from tests.quant_models import outlier_inputs, outlier_mlp


def test_int8_dynamic_excludes_by_pattern_and_weight_shape() -> None:
    model = mlp()  # fc1: MatMul w1 32x64, fc2: Gemm w2 64x16
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(nodes_to_exclude=("fc1*",), exclude_weight_shapes=("64x16",)))
    assert not pass_(model).modified  # both candidates excluded: nothing to quantize
    assert pass_.stats["skipped"] == "every candidate excluded" and pass_.stats["excluded"] == ["fc1", "fc2"]
    model = mlp()
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(nodes_to_exclude=("fc?",), op_types=("MatMul", "Gemm")))
    pass_(model)
    assert pass_.stats["excluded"] == ["fc1", "fc2"]
    model = mlp()
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(exclude_weight_shapes=("32x64",)))
    assert pass_(model).modified
    assert pass_.stats["excluded"] == ["fc1"] and pass_.stats["nodes_quantized"] == 1
    assert [n.name for n in model.graph if n.op_type == "MatMul"] == ["fc1"]  # still float
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"nodes_to_exclude": ("node_MatMul_91",)}, "matches no quantizable node .*fc1, fc2"),
        ({"exclude_weight_shapes": ("1536x384",)}, "matches no quantizable node's weight"),
    ],
)
def test_int8_dynamic_exclusion_matching_nothing_is_an_error(params: dict, match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        QuantizeDynamicPass(QuantizeDynamicParams(**params))(mlp())


def test_int8_dynamic_rejects_bad_new_options() -> None:
    with pytest.raises(OptionsError, match="smooth_alpha needs calibration_dir"):
        make_pass("int8-dynamic", {"smooth_alpha": "0.8"})
    with pytest.raises(OptionsError, match=r"smooth_alpha is in \[0, 1\)"):
        make_pass("int8-dynamic", {"smooth_alpha": "1.5", "calibration_dir": "x"})
    with pytest.raises(OptionsError, match="not like 1536x384"):
        make_pass("int8-dynamic", {"exclude_weight_shapes": "1536 by 384"})


def test_smoothing_is_exact_in_fp32() -> None:
    model = outlier_mlp()
    x = outlier_inputs(4, seed=5)
    expected = [quant_models.run(model, {"x": s}) for s in x]
    smoothed = prep.smooth(model, [{"x": s} for s in x], alpha=0.8, min_ratio=0.0)
    assert smoothed == ["fc1", "fc2"] and sum(n.op_type == "Mul" for n in model.graph) == 2
    for s, e in zip(x, expected, strict=True):
        assert rel_l2(quant_models.run(model, {"x": s}), e) < 1e-5


def test_int8_dynamic_smoothing_cuts_the_error_of_outlier_channels(tmp_path: Path) -> None:
    calib = quant_models.save_stack(tmp_path / "calib", {"x": outlier_inputs(8, seed=1)})
    test = outlier_inputs(1, seed=2)[0]
    expected = quant_models.run(outlier_mlp(), {"x": test})
    errors = {}
    for alpha in (0.0, 0.8):
        model = outlier_mlp()
        pass_ = QuantizeDynamicPass(QuantizeDynamicParams(calibration_dir=calib, smooth_alpha=alpha))
        assert pass_(model).modified and pass_.stats["nodes_quantized"] == 2
        errors[alpha] = rel_l2(quant_models.run(model, {"x": test}), expected)
        if alpha:
            assert pass_.stats["smoothed"]["nodes"] == 2
            assert not QuantizeDynamicPass(QuantizeDynamicParams(calibration_dir=calib, smooth_alpha=alpha))(
                model
            ).modified  # idempotent: a quantized graph is left alone
    assert errors[0.8] < 0.5 * errors[0.0] and errors[0.8] < 0.02


def test_int8_dynamic_smooth_min_ratio_skips_nodes_without_outliers(tmp_path: Path) -> None:
    calib = quant_models.save_stack(tmp_path / "calib", {"x": outlier_inputs(4, seed=1)})
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(calibration_dir=calib, smooth_alpha=0.8, smooth_min_ratio=8.0))
    pass_(outlier_mlp())
    assert pass_.stats["smoothed"]["names"] == ["fc1"]  # fc2's input (after Relu) has no outlier channel


def test_split_skip_layer_norm_is_exact_and_idempotent() -> None:
    model = quant_models.skip_layer_norm_block()
    rng = np.random.default_rng(4)
    feeds = {n: rng.standard_normal((1, quant_models.SEQ, quant_models.HIDDEN)).astype(np.float32) for n in "xs"}
    expected = quant_models.run(model, feeds)
    assert prep.split_skip_layer_norm(model) == 2
    assert sorted(n.op_type for n in model.graph) == ["Add", "Add", "Add", "LayerNormalization", "LayerNormalization"]
    assert rel_l2(quant_models.run(model, feeds), expected) < 1e-5
    assert prep.split_skip_layer_norm(model) == 0
    keeps = quant_models.skip_layer_norm_block(read_mean=True)  # its mean output is read: left fused
    assert prep.split_skip_layer_norm(keeps) == 1
    assert [n.name for n in keeps.graph if n.op_type == "SkipLayerNormalization"] == ["sln1"]


def test_int8_dynamic_split_skip_layer_norm_option() -> None:
    model = outlier_mlp()
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(split_skip_layer_norm=True))
    pass_(model)
    assert pass_.stats["skip_layer_norm_split"] == 0 and pass_.stats["nodes_quantized"] == 2
