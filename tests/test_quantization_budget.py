"""The int8 passes' accuracy budget: methods tried and nodes excluded on held-out inputs until it holds, or a
failure naming the ranking and the best reached."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aotforge.core.errors import PassFailedError
from aotforge.passes.quantize_dynamic import QuantizeDynamicParams, QuantizeDynamicPass
from aotforge.passes.quantize_static import QuantizeStaticParams, QuantizeStaticPass
from tests import quant_models
from tests.pass_models import mlp, rel_l2
from tests.quant_models import outlier_inputs, outlier_mlp


def test_int8_static_budget_excludes_worst_nodes_until_it_holds() -> None:
    model = mlp()
    pass_ = QuantizeStaticPass(QuantizeStaticParams(samples=8, min_cosine=0.9995, search=False))
    pass_(model)
    budget = pass_.stats["accuracy_budget"]
    assert budget["tried"][0]["mean"] < 0.9995 <= budget["held_out"]["mean"]
    assert budget["exclusions"] and budget["exclusions"][0] == budget["ranking"][0]["node"]
    assert set(budget["exclusions"]) <= set(pass_.stats["excluded"])
    assert pass_.stats["qdq_nodes"] > 0
    assert pass_.stats["method"] == budget["chosen"] == {"activations": "uint8", "kind": "static", "per_channel": True}


def test_int8_static_budget_off_measures_nothing() -> None:
    pass_ = QuantizeStaticPass(QuantizeStaticParams(samples=8))
    pass_(mlp())
    assert "accuracy_budget" not in pass_.stats and pass_.stats["excluded"] == []
    assert pass_.stats["method"] == {"activations": "uint8", "kind": "static", "per_channel": True}


@pytest.mark.parametrize("cls", [QuantizeStaticPass, QuantizeDynamicPass])
def test_budget_search_tries_methods_on_held_out_inputs_and_records_the_choice(cls: type, tmp_path: Path) -> None:
    calib = quant_models.save_stack(tmp_path / "calib", {"x": outlier_inputs(24, seed=1)})
    params = cls.Params(calibration_dir=calib, samples=16, eval_samples=8, min_cosine=0.9999)
    pass_ = cls(params)
    model = outlier_mlp()
    pass_(model)
    budget = pass_.stats["accuracy_budget"]
    # Per-tensor int8 of the outlier channel misses the budget; smoothing it (alpha 0.8, tried first) holds it.
    assert budget["tried"][0]["mean"] < 0.9999 <= budget["held_out"]["mean"] == budget["tried"][-1]["mean"]
    assert budget["held_out"]["samples"] == 8 and pass_.stats["calibration_samples"] == 16
    chosen = {"kind": "dynamic", "per_channel": True, "smooth_alpha": 0.8, "smooth_min_ratio": 5.0}
    assert pass_.stats["method"] == budget["chosen"] == chosen and budget["exclusions"] == []
    assert pass_.stats["smoothed"]["names"] == ["fc1"] and pass_.stats["ops"]["MatMulInteger"] == 2
    x = outlier_inputs(1, seed=7)[0]
    assert rel_l2(quant_models.run(model, {"x": x}), quant_models.run(outlier_mlp(), {"x": x})) < 0.02


@pytest.mark.parametrize("cls", [QuantizeStaticPass, QuantizeDynamicPass])
def test_impossible_budget_fails_with_the_ranking_and_the_best_cosine(cls: type, tmp_path: Path) -> None:
    calib = quant_models.save_stack(tmp_path / "calib", {"x": outlier_inputs(12, seed=1)})
    params = cls.Params(calibration_dir=calib, samples=8, eval_samples=4, min_cosine=1.0, max_exclusions=1)
    with pytest.raises(PassFailedError, match="no method holds the accuracy budget") as info:
        cls(params)(outlier_mlp())
    message = str(info.value)
    assert re.search(r"best reached: mean 0\.99\d+, min 0\.99\d+ \(dynamic, per-channel", message)
    assert re.search(r"by added error: fc\d \(\d", message) and "fc1" in message and "fc2" in message
    # the methods tried, then one exclusion
    assert "smooth 0.8" in message and "smooth 0.5" in message and "1 float" in message


def test_int8_dynamic_budget_and_held_out_gate(tmp_path: Path) -> None:
    calib = quant_models.save_stack(tmp_path / "calib", {"x": outlier_inputs(8, seed=1)})
    held = quant_models.save_stack(tmp_path / "held", {"x": outlier_inputs(8, seed=9)})
    params = QuantizeDynamicParams(
        calibration_dir=calib, eval_dir=held, min_cosine=0.9999, min_sample_cosine=0.999, search=False
    )
    pass_ = QuantizeDynamicPass(params)
    pass_(outlier_mlp())
    budget = pass_.stats["accuracy_budget"]
    assert budget["held_out"]["samples"] == 2  # too few files past `samples`: the last quarter is held out
    assert budget["tried"][0]["mean"] < 0.9999 <= budget["held_out"]["mean"]
    assert budget["exclusions"] and set(budget["exclusions"]) <= set(pass_.stats["excluded"])
    assert pass_.stats["eval"]["samples"] == 8 and pass_.stats["eval"]["mean"] >= 0.9999
    strict = QuantizeDynamicParams(calibration_dir=calib, eval_dir=held, min_cosine=1.0, max_exclusions=0)
    with pytest.raises(PassFailedError, match="no method holds the accuracy budget"):
        QuantizeDynamicPass(strict)(outlier_mlp())
