"""``aotforge qat``: training through a target's exact weight rounding. The fake quantization is each target's own
grid (checked against ONNX Runtime's quantizer and tvm's packing), the trained model is written as a transformers
directory that compiles as usual (its int4 weights exactly what training computed with), and the report carries the
held-out perplexities before and after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from aotforge.compiler.training.fake_quant import grid
from tests.llm_models import build_text_generation
from tests.serving import chat_llama_dir

FAST = ["--max-steps", "6", "--seq-len", "64", "--batch", "2", "--held-out-tokens", "256", "--lr", "1e-3"]
GENEROUS = 10.0


def _random_weight(n: int = 48, k: int = 128) -> np.ndarray:
    return np.random.default_rng(3).normal(0, 0.1, (n, k)).astype(np.float32)


def _ort_rounding(w_nk: np.ndarray, bits: int, block: int) -> np.ndarray:
    """ONNX Runtime's MatMulNBits quantizer (what the onnxruntime build calls) on ``w_nk``, dequantized."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    n, k = w_nk.shape
    blocks, per_byte = -(-k // block), 8 // bits
    packed = np.zeros((n, blocks, block // per_byte), np.uint8)
    zero_points = np.zeros((n, -(-blocks // per_byte)), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    quantize = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    quantize(packed, np.ascontiguousarray(w_nk.T), scales, zero_points, block, n, k, True)
    return _dequantized_nbits(packed, scales, bits, n, k)


def _dequantized_nbits(packed: np.ndarray, scales: np.ndarray, bits: int, n: int, k: int) -> np.ndarray:
    """MatMulNBits' symmetric ``B`` (``[N, blocks, bytes]``, low nibble first) and scales as a ``[N, K]`` float."""
    packed = packed.reshape(n, -1)
    if bits == 4:
        q = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, -1).astype(np.int32) - 8
    else:
        q = packed.astype(np.int32) - 128
    q = q.reshape(n, scales.size // n, -1)
    return (q.astype(np.float32) * scales.reshape(n, -1, 1).astype(np.float32)).reshape(n, -1)[:, :k]


def _tvm_rounding(w_nk: np.ndarray, bits: int, block: int) -> np.ndarray:
    from aotforge.targets.tvm.kernels import weight_only as kernel

    packed, scales = kernel.pack(w_nk, bits, block)
    return kernel.unpack(packed, scales, bits, block)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("target", "rounding"), [("onnxruntime", _ort_rounding), ("tvm", _tvm_rounding)])
def test_fake_quant_is_the_targets_own_rounding(target: str, rounding: Any, bits: int) -> None:
    import torch

    w = _random_weight()
    w[0, :32] *= 1e-6  # a block far below the rest: its own scale
    w[1, 3], w[1, 10] = 0.5, -0.5  # blocks whose extremes tie in magnitude, +a first, then -a first: the
    w[2, 3], w[2, 10] = -0.5, 0.5  # targets break the tie differently (MLAS keeps -a, tvm the first)
    got = grid(target, bits, 32)(torch.from_numpy(w)).numpy()
    np.testing.assert_array_equal(got, rounding(w, bits, 32))


def test_fake_quant_pads_a_partial_block_as_onnxruntime_does() -> None:
    import torch

    w = _random_weight(16, 112)  # K = 3.5 blocks of 32
    got = grid("onnxruntime", 4, 32)(torch.from_numpy(w)).numpy()
    np.testing.assert_array_equal(got, _ort_rounding(w, 4, 32))


def test_the_gradient_passes_the_rounding_straight_through() -> None:
    import torch

    from aotforge.compiler.training.fake_quant import FakeQuant

    w = torch.from_numpy(_random_weight()).requires_grad_()
    out = FakeQuant(grid("onnxruntime", 4, 32), transposed=False)(w)
    (out * 3).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.full_like(w, 3.0))
    assert not torch.equal(out, w)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_llama_dir(tmp_path_factory.mktemp("qat") / "llama")


def test_qat_writes_a_model_whose_int4_build_is_what_training_computed(tiny_llama: Path, tmp_path: Path) -> None:
    """The report has the held-out perplexities at fp32 and at int4 before and after; the directory compiles with
    --precision int4 without a second calibration, and every packed weight of the artifact is the training's
    fake-quantized weight, bit for bit."""
    import onnx
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "qat"
    ran = CliRunner().invoke(main, ["qat", str(tiny_llama), "--out", str(out), *FAST, "--json"])
    assert ran.exit_code == 0, ran.output
    report = json.loads(ran.output[ran.output.index("{") :])
    assert report["steps"] == 6 and report["start_method"] == "awq" and report["weights_fake_quantized"] == 15
    for when in ("before", "after"):
        assert report[when]["student_perplexity"] > 1 and report[when]["teacher_perplexity"] > 1
    assert json.loads((out / "qat_report.json").read_text()) == report
    trained = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert trained.config.aotforge_qat["target"] == "onnxruntime"

    result = build_text_generation(out, tmp_path / "art", precision="int4", max_perplexity_increase=GENEROUS)
    (calibration,) = [p for p in result.manifest.passes if p["name"] == "calibrate-int4"]
    assert calibration["stats"]["skipped"] == "trained by aotforge qat" and calibration["stats"]["method"] == "rtn"
    # onnxruntime packs sibling matmuls (q, k, v) into one along N; blocks run along K, so each row is one weight's.
    expected = {
        row.tobytes()
        for name, w in trained.state_dict().items()
        if name.endswith("proj.weight") or name == "lm_head.weight"
        for row in grid("onnxruntime", 8 if name == "lm_head.weight" else 4, 32)(w).numpy()
    }
    decode = onnx.load(str(Path(result.path) / "decode.onnx"))
    weights = {t.name: onnx.numpy_helper.to_array(t, base_dir=str(result.path)) for t in decode.graph.initializer}
    nodes = [n for n in decode.graph.node if n.op_type == "MatMulNBits"]
    rows = 0
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        n, k, bits = attrs["N"], attrs["K"], attrs["bits"]
        got = _dequantized_nbits(weights[node.input[1]], weights[node.input[2]], bits, n, k)
        assert all(row.tobytes() in expected for row in got), node.name
        rows += n
    assert rows == len(expected)


@pytest.mark.slow  # ten minutes of training on 2 cores, then an int4 build of the real model
def test_qat_of_smollm2_recovers_int4_perplexity_on_held_out_text(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (tools/real_model.py), trained on stdlib docstrings, scored on the quality gate's corpus
    (text it never trained on): the int4 model's held-out perplexity comes closer to the fp32 model's, and the
    artifact built from it passes the default quality gate."""
    from tools.real_model import smollm2_dir

    out = tmp_path / "qat"
    args = ["qat", str(smollm2_dir()), "--out", str(out), "--max-minutes", "10", "--seq-len", "256", "--json"]
    ran = CliRunner().invoke(main, args)
    assert ran.exit_code == 0, ran.output
    report = json.loads(ran.output[ran.output.index("{") :])
    assert report["after"]["student_perplexity"] < report["before"]["student_perplexity"]
    assert report["gap_recovered"] > 0
    print(json.dumps({k: report[k] for k in ("before", "after", "gap_recovered", "steps")}))  # noqa: T201
    result = build_text_generation(out, tmp_path / "art", precision="int4", max_seq_len=512)
    assert result.manifest.validation["quality"]["perplexity_increase"] < 0.05
