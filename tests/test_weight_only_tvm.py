"""Weight-only int4 / int8 on tvm text-generation builds: packing, the VNNI kernel against numpy, the build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.core.errors import OptionsError
from aotforge.passes.quantize_weight_only import DECODER_INT4_METHOD
from aotforge.targets.tvm.kernels import weight_only as wo
from tests.int8_graphs import needs_vnni
from tests.llm_models import MAX_SEQ, PROMPTS, build_text_generation, tiny_llama
from tests.lm_pair import torch_perplexity
from tests.quality_gates import VARIANTS

FORMATS = [(4, 32), (4, 64), (4, 128), (8, 32)]
ROWS = (1, 3, 8)


@pytest.mark.parametrize(("bits", "group"), FORMATS)
def test_packing_round_trips(bits: int, group: int) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 256)).astype(np.float32)  # [N, K]
    w[3, :group] = 0.0  # an all-zero group keeps a usable scale
    packed, scales = wo.pack(w, bits, group)
    assert (packed.shape, scales.shape) == wo.packed_shapes(256, 48, bits, group)
    back = wo.unpack(packed, scales, bits, group)
    if bits == 4:
        q, s = wo.quantize_int4(w, group)
        assert q.min() >= -8 and q.max() <= 7
        expected = (q.reshape(48, -1, group) * s[:, :, None]).reshape(48, 256)
        step = np.repeat(s, group, axis=1)
    else:
        q, s = wo.quantize_int8(w)
        assert q.min() >= -127 and q.max() <= 127
        expected, step = q * s[:, None], np.broadcast_to(s[:, None], w.shape)
    np.testing.assert_array_equal(back, expected.astype(np.float32))
    # round to nearest: within half a step (int4: a whole one where the far side clips at +7)
    assert np.all(np.abs(back - w) <= np.abs(step) * (1.0 if bits == 4 else 0.5) + 1e-6)
    assert np.all(back[3, :group] == 0)
    # the packed bytes are what they say: repacking the dequantized weight gives the same bytes
    again, _ = wo.pack(back, bits, group)
    np.testing.assert_array_equal(again, packed)


def test_refusals() -> None:
    from aotforge.targets.tvm.rewrites.weight_only import WeightOnlyFormat

    for bits, group in ((4, 16), (4, 256), (4, 48), (3, 32)):
        with pytest.raises(OptionsError, match="tvm weight-only"):
            WeightOnlyFormat(bits, group)
    assert wo.supports(576, 500, 4, 32) == "N=500 is not a multiple of 16"
    assert wo.supports(576, 1536, 4, 128) == "K=576 is not a multiple of the group 128"
    assert wo.supports(576, 1536, 8, 64) == ""
    with pytest.raises(ValueError, match="multiple of 16"):
        wo.pack(np.zeros((20, 64), np.float32), 4, 32)
    with pytest.raises(ValueError, match="group 64"):
        wo.pack(np.zeros((16, 96), np.float32), 4, 64)


@needs_vnni
@pytest.mark.parametrize(("bits", "group"), FORMATS)
def test_kernel_matches_numpy(bits: int, group: int) -> None:
    """Decode rows (1, 3) and a prefill tile (8): the kernel equals its numpy model, fp32 within the format's error."""
    import tvm

    from aotforge.targets.tvm.options import TvmOptions, target_dict

    k, n = 256, 96
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    packed, scales = wo.pack(w, bits, group)
    funcs = {
        f"m{m}": wo.weight_only_matmul(m, k, n, bits, group).with_attr("global_symbol", f"m{m}") for m in (1, 3, 8)
    }
    lib = tvm.compile(tvm.IRModule(funcs), target=tvm.target.Target(target_dict(TvmOptions()))).jit()
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :group] = 0.0  # an all-zero activation block
        out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
        lib[f"m{m}"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), tvm.runtime.tensor(scales), out)
        np.testing.assert_allclose(out.numpy(), wo.reference(x, packed, scales, bits, group), rtol=1e-5, atol=1e-5)
        exact = x @ w.T
        rel = np.linalg.norm(out.numpy() - exact) / np.linalg.norm(exact)
        assert rel < (0.15 if bits == 4 else 0.02), rel


#: The int4 g32 perplexity budget over fp32: the gate ``tests/quality_gates.py`` holds the trained model's int4 g32
#: build to, the quality a user of ``--passes weight-only`` (bits 4, block 32) is promised.
INT4_BUDGET = dict((name, allowed) for name, _, allowed in VARIANTS)["int4-g32"]


def _tied_llama(directory: Path) -> Any:
    """A tied-head tiny Llama whose vocabulary (512) the kernel takes, so the head is packed too. Its weights
    (initializer range 0.1) make its next-token guesses clearly sharper than a uniform guess over the vocabulary,
    so the perplexity budget below tells working int4 weights from lost ones."""
    model = tiny_llama(vocab_size=512, initializer_range=0.1, tie_word_embeddings=True)
    model.save_pretrained(directory)
    return model


def _own_text(model: Any, rows: int = 4) -> np.ndarray:
    """Text the fp32 model itself samples (temperature 1): windows of ``MAX_SEQ + 1`` tokens, one per row."""
    import torch

    torch.manual_seed(1)
    prompt = torch.tensor([PROMPTS[0][:4]] * rows)
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=True,
        top_k=0,
        top_p=1.0,
        max_new_tokens=MAX_SEQ + 1 - prompt.shape[1],
        min_new_tokens=MAX_SEQ + 1 - prompt.shape[1],
    )
    return out.numpy().reshape(-1)


@needs_vnni
def test_tiny_llama_int4_through_tvm(tmp_path: Path) -> None:
    """--passes weight-only on tvm: every projection and the tied head packed, the embedding lookup kept float;
    the artifact's perplexity on text the fp32 model samples stays within the int4 g32 budget of the fp32
    model's own (transformers; the fp32 tvm artifact equals it, tests/test_generative_tvm.py), and it generates."""
    model = _tied_llama(tmp_path / "llama")
    # One prefill and one decode function (batch 1, prompts up to 64): what is packed is the same in each.
    result = build_text_generation(
        tmp_path / "llama",
        tmp_path / "out",
        "tvm",
        max_batch=1,
        passes=["weight-only"],
        pass_params={"weight-only": {"bits": 4, "block_size": 32}},
        max_perplexity_increase=10.0,  # a random model: the quality is recorded, not judged
        target_options={"buckets": ("prompt=64",)},
    )
    report = result.manifest.target.info["generative"]["weight_only"]
    taken = report["weights_taken"]
    assert len(taken) == 2 * 7 + 1, taken  # q, k, v, o, gate, up, down per layer + the head
    assert any("(read transposed)" in v for v in taken.values())
    # prefill's two attention matmuls a layer (decode's attention runs on its kernel, the dead matmuls it left gone)
    assert report["matmuls_skipped"] == {"the right operand is not a weight argument": 2 * 2}
    calibration, entry = result.manifest.passes  # the weights calibrated by the default int4 method, then packed
    assert calibration["name"] == "calibrate-int4" and calibration["stats"]["method"] == DECODER_INT4_METHOD
    assert entry["name"] == "weight-only" and entry["params"]["bits"] == 4 and entry["stats"] == report
    assert "token_agreement" in result.manifest.validation  # measured and recorded, though not gated here
    info = json.loads((result.path / "tvm_generative.json").read_text())
    assert {w["file"] for w in info["weights"].values()} == {"tvm_weights.data"}
    assert not (result.path / "weights.data").exists()
    originals = [w for w in info["weights"].values() if "." not in w["name"]]  # packed ones are w<offset>.<format>
    assert [w["shape"] for w in originals if len(w["shape"]) == 2] == [[512, 64]]  # the embedding, for its lookup

    text = _own_text(model)
    fp32 = torch_perplexity(model, text.tolist(), MAX_SEQ + 1)
    assert fp32 * (1 + INT4_BUDGET) < 512, fp32  # weights lost (a uniform guess, perplexity 512) would fail
    artifact = aotforge.load(result.path)
    int4 = artifact.perplexity(text, MAX_SEQ + 1).perplexity
    print(f"perplexity on its own text: fp32 {fp32:.2f}, int4 g32 artifact {int4:.2f}")
    assert int4 <= fp32 * (1 + INT4_BUDGET), (int4, fp32)
    out = artifact.generate(np.array([PROMPTS[0]]), 5, ignore_eos=True)
    assert out.shape == (1, len(PROMPTS[0]) + 5)


def test_refused_before_export(tmp_path: Path) -> None:
    from tests.llm_models import tiny_causal_lm

    model: Any = tiny_causal_lm("llama")
    for params, match in (
        ({"block_size": 16}, "block_size is one of 32, 64, 128"),
        ({"symmetric": False}, "symmetric"),
        ({"accuracy_level": 1}, "accuracy_level"),
    ):
        with pytest.raises(OptionsError, match=match):
            build_text_generation(model, tmp_path, "tvm", passes=["weight-only"], pass_params={"weight-only": params})


@needs_vnni
@pytest.mark.slow  # four tvm builds of the trained target (a few minutes each on a loaded 2-core machine)
def test_quality_gates_on_the_trained_target(lm_pair: Any, tmp_path: Path) -> None:
    """Held-out perplexity through the tvm artifacts (``tests/quality_gates.py``): int8 <= +2%, int4 g32 / g64 <= +8%
    of the fp32 artifact's; greedy agreement with the fp32 artifact reported (run with -s for the figures)."""
    from tests.quality_gates import assert_within_gates, build_trained_target, quality_report

    def build(name: str, params: Any) -> Any:
        buckets = {"buckets": ("prompt=64", "batch=4")}
        return build_trained_target(lm_pair, tmp_path / name, "tvm", params, target_options=buckets)

    def check(name: str, result: Any) -> None:
        stats = result.manifest.target.info["generative"]["weight_only"]
        assert len(stats["weights_taken"]) == 4 * 7 + 1, stats  # every projection of 4 layers + the head

    report = quality_report(lm_pair, build, check)
    print(json.dumps(report, indent=1))  # noqa: T201  (the figures the closing note quotes)
    assert_within_gates(report)


@needs_vnni
@pytest.mark.parametrize(("bits", "group", "k"), [(4, 128, 96), (4, 64, 200), (8, 128, 72)])
def test_a_k_short_of_whole_groups_is_padded_with_zeros(bits: int, group: int, k: int) -> None:
    """K=96 at group 128 (as SmolLM's 576 is): the weight and the activations padded with zeros to whole
    groups, the report says so, and the rewritten matmul equals the kernel's numpy model on the padded
    operands (within the format's error of x @ w)."""
    import tvm
    from tvm import relax

    from aotforge.targets.tvm.options import TvmOptions, target_dict
    from aotforge.targets.tvm.rewrites.weight_only import WeightOnlyFormat, weight_only_matmuls

    n, rows = 48, 3
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    bb = relax.BlockBuilder()
    x_var = relax.Var("x", relax.TensorType((rows, k), "float32"))
    w_var = relax.Var("w", relax.TensorType((k, n), "float32"))
    with bb.function("main", [x_var, w_var], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x_var, w_var))
        bb.emit_func_output(y)
    mod, packed, report = weight_only_matmuls(
        bb.get(), lambda _name: w, WeightOnlyFormat(bits, group), vnni=True, cpu="host"
    )
    padded = -(-k // group) * group
    assert report["k_padded"] == {"w": f"{k} -> {padded}"} and report["matmuls_taken"] == 1
    q, s = (packed[name] for name in sorted(packed))  # ".q" sorts before ".s"
    lib = tvm.compile(mod, target=tvm.target.Target(target_dict(TvmOptions())))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    x = rng.standard_normal((rows, k)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(q), tvm.runtime.tensor(s)).numpy()
    x_padded = np.pad(x, ((0, 0), (0, padded - k)))
    np.testing.assert_allclose(got, wo.reference(x_padded, q, s, bits, group), rtol=1e-5, atol=1e-5)
    rel = np.linalg.norm(got - x @ w) / np.linalg.norm(x @ w)
    assert rel < (0.15 if bits == 4 else 0.02), rel


@needs_vnni
def test_head_bits_packs_the_head_at_its_own_bits() -> None:
    """``head_bits=8`` with int4: the matmul as wide as the vocabulary (the head) is packed int8, the rest int4."""
    from tvm import relax

    from aotforge.targets.tvm.rewrites.weight_only import WeightOnlyFormat, weight_only_matmuls

    k, hidden, vocab, rows = 64, 48, 80, 2
    rng = np.random.default_rng(6)
    weights = {"w": rng.standard_normal((k, hidden)), "head": rng.standard_normal((hidden, vocab))}
    bb = relax.BlockBuilder()
    x_var = relax.Var("x", relax.TensorType((rows, k), "float32"))
    w_var = relax.Var("w", relax.TensorType((k, hidden), "float32"))
    head_var = relax.Var("head", relax.TensorType((hidden, vocab), "float32"))
    with bb.function("main", [x_var, w_var, head_var], attrs={"num_input": 1}):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x_var, w_var))
            y = bb.emit_output(relax.op.matmul(h, head_var))
        bb.emit_func_output(y)
    fmt = WeightOnlyFormat(4, 32, head_bits=8, head_n=vocab)
    _, packed, report = weight_only_matmuls(
        bb.get(), lambda name: weights[name].astype(np.float32), fmt, vnni=True, cpu="host"
    )
    assert report["bits"] == 4 and report["head_bits"] == 8 and report["matmuls_taken"] == 2
    assert report["weights_taken"]["head"].endswith("at 8 bits (the head)")
    assert not report["weights_taken"]["w"].endswith("(the head)")
    assert sorted(packed) == ["head.int8g32.q", "head.int8g32.s", "w.int4g32.q", "w.int4g32.s"]
