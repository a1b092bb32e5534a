"""Calibrated and mixed-precision int4 for decoders (``weight-only.method``, ``layers_8bit``,
``sensitive_layers_8bit``): the calibration keeps what the targets' rounding reads, AWQ's scaling keeps the float
function, and a build records which method and bits each matmul got and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aotforge.compiler.generative import calibrate
from aotforge.compiler.generative.sensitivity import layer_costs, most_sensitive
from aotforge.core.decoder_layers import layer_indices
from aotforge.core.errors import OptionsError
from aotforge.passes.quantize_weight_only import QuantizeWeightOnlyParams
from aotforge.targets.tvm.kernels import weight_only as kernel
from tests.int8_graphs import needs_vnni
from tests.llm_models import ARCHITECTURES, VOCAB, build_text_generation, tiny_causal_lm

GENEROUS = 10.0
TOKENS = np.random.default_rng(0).integers(0, VOCAB, 600)


def _logits(model: Any, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(input_ids=torch.from_numpy(ids[None])).logits[0].numpy()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_awq_scaling_keeps_the_float_model(arch: str) -> None:
    """The scales folded into the norms (and up_proj) cancel: the calibrated copy computes what the source does
    before rounding; only the clipped blocks differ, so the scaling alone is checked (clip ratios of 1)."""
    model = tiny_causal_lm(arch)
    copy = __import__("copy").deepcopy(model)
    windows = calibrate.calibration_windows(TOKENS, model)
    groups = [g for layer in calibrate.layer_groups(copy) for g in layer]
    assert groups, f"{arch}: no AWQ group found"
    saved = calibrate.CLIP_RATIOS
    try:
        calibrate.CLIP_RATIOS = (1.0,)
        report = calibrate.awq(copy, windows, 32)
    finally:
        calibrate.CLIP_RATIOS = saved
    assert len(report["scaled"]) == len(groups)
    ids = TOKENS[:40]
    np.testing.assert_allclose(_logits(copy, ids), _logits(model, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [32, 64])
def test_gptq_weights_are_kept_by_the_targets_rounding(group: int) -> None:
    """What GPTQ writes, the targets' round-to-nearest (ONNX Runtime's rule, tvm's packing) maps to itself."""
    import torch

    rng = np.random.default_rng(1)
    w = torch.from_numpy(rng.normal(0, 0.1, (48, 128)).astype(np.float32))
    x = torch.from_numpy(rng.normal(0, 1, (256, 128)).astype(np.float32))
    q = calibrate.gptq_int4(w, x.t() @ x, group).numpy()
    q_rtn, scales = kernel.quantize_int4(q, group)
    np.testing.assert_array_equal(q_rtn.reshape(48, -1, group) * scales[:, :, None], q.reshape(48, -1, group))
    packed, s = kernel.pack(q, 4, group)
    np.testing.assert_array_equal(kernel.unpack(packed, s, 4, group), q)
    # ...and it errs less than rounding on the inputs it was calibrated on.
    rtn = calibrate.rtn_int4(w, group)
    assert float(((x @ (w - torch.from_numpy(q)).t()) ** 2).sum()) < float(((x @ (w - rtn).t()) ** 2).sum())


def test_layer_indices_read_layers_from_shapes() -> None:
    layer = [(4, 8), (4, 4), (8, 4)]
    assert layer_indices(layer * 3, 3) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert layer_indices(layer * 3, 2) is None
    assert layer_indices([*layer, *reversed(layer)], 2) is None


def test_sensitivity_ranks_every_layer() -> None:
    model = tiny_causal_lm("llama")
    costs = layer_costs(model, model, calibrate.calibration_windows(TOKENS, model)[:1], 32)
    assert len(costs) == 2 and all(c > 0 for c in costs)
    assert most_sensitive(costs, 1) == [int(np.argmax(costs))]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"method": "awq-ish"}, "method is one of"),
        ({"layers_8bit": ("x",)}, "layer indices"),
        ({"sensitive_layers_8bit": -1}, "sensitive_layers_8bit >= 0"),
    ],
)
def test_bad_calibration_params_are_refused(params: dict[str, Any], match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        QuantizeWeightOnlyParams(**params)


def _pass(result: Any, name: str) -> list[dict[str, Any]]:
    return [p for p in result.manifest.passes if p["name"] == name]


#: Qwen2's build is slow: its layers are the Llama's with Q/K/V biases, which the calibration's scales leave alone
#: (test_awq_scaling_keeps_the_float_model[qwen2] above, by default); the Llama's and GPT-2's (Conv1D) builds run.
CALIBRATED = [pytest.param(a, marks=pytest.mark.slow) if a == "qwen2" else a for a in ARCHITECTURES]


@pytest.mark.parametrize("arch", CALIBRATED)
def test_calibrated_mixed_int4_records_method_and_bits(arch: str, tmp_path: Path) -> None:
    """awq+gptq with the most sensitive layer at 8 bits on onnxruntime: the calibration's entry names the ranking,
    the pass names the bits of every matmul of the decode graph (that layer's at 8), the gate reports perplexity
    and KL."""
    result = build_text_generation(
        tiny_causal_lm(arch),
        tmp_path,
        precision="int4",
        pass_opt=["weight-only.method=awq+gptq", "weight-only.sensitive_layers_8bit=1"],
        max_perplexity_increase=GENEROUS,
        plots=False,
    )
    (calibration,) = _pass(result, "calibrate-int4")
    stats = calibration["stats"]
    assert stats["method"] == "awq+gptq" and len(stats["layer_kl_at_4_bits"]) == 2
    (chosen,) = stats["layers_8bit"]
    assert "rank 1 of 2" in stats["layers_8bit"][chosen]
    for entry in _pass(result, "weight-only"):
        bits = entry["stats"]["bits_by_node"]
        assert list(entry["params"]["layers_8bit"]) == [int(chosen)] and entry["stats"]["method"] == "awq+gptq"
        if entry["graph"] == "decode":
            assert sorted(set(bits.values())) == [4, 8] and sum(b == 4 for b in bits.values()) >= 2
        else:  # the prompt graphs run every matmul but the head as 8-bit integer GEMM (weight-only.prompt_int8)
            assert set(bits.values()) == {8} and set(entry["stats"]["integer_gemm"]) < set(bits)
    quality = result.manifest.validation["quality"]
    assert quality["perplexity"] > 1 and quality["mean_kl"] > 0


def test_hqq_builds_asymmetric_blocks_on_onnxruntime(tmp_path: Path) -> None:
    result = build_text_generation(
        tiny_causal_lm("llama"),
        tmp_path,
        precision="int4",
        pass_opt=["weight-only.method=hqq"],
        max_perplexity_increase=GENEROUS,
        plots=False,
    )
    (entry, *_) = _pass(result, "weight-only")
    assert entry["stats"]["method"] == "hqq" and entry["stats"]["symmetric"] is False
    assert entry["stats"]["nodes_quantized"] == entry["stats"]["candidates"]
    assert result.manifest.validation["quality"]["perplexity"] > 1


def test_tvm_refuses_hqq_before_the_export(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="method hqq fits a zero point"):
        build_text_generation(
            tiny_causal_lm("llama"), tmp_path, target="tvm", precision="int4", pass_opt=["weight-only.method=hqq"]
        )


@needs_vnni
def test_calibrated_mixed_int4_through_tvm(tmp_path: Path) -> None:
    """The calibrated weights reach tvm's packed kernel too, and layers_8bit packs that layer's weights at 8 bits
    (the tied head at head_bits 8): the report says which and why."""
    result = build_text_generation(
        tiny_causal_lm("llama"),
        tmp_path,
        "tvm",
        max_batch=1,
        precision="int4",
        pass_opt=["weight-only.method=awq+gptq", "weight-only.layers_8bit=1"],
        max_perplexity_increase=GENEROUS,
        target_options={"buckets": ("prompt=64",)},
        plots=False,
    )
    assert _pass(result, "calibrate-int4")[0]["stats"]["method"] == "awq+gptq"
    taken = result.manifest.target.info["generative"]["weight_only"]["weights_taken"]
    assert sum("at 8 bits (layers_8bit)" in v for v in taken.values()) == 7, taken  # layer 1's seven matmuls
    assert sum(" at " not in v for v in taken.values()) == 7  # layer 0's at 4 bits
    assert result.manifest.validation["quality"]["perplexity"] > 1
