"""Low-bit text-generation builds: ``--precision int4 / int8`` builds a weight-only decoder on both CPU targets, and
a build whose passes change numerics is gated on held-out perplexity against the fp32 model (KL and token
agreement recorded), not on exact tokens; fp32 builds keep their token-exact gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aotforge.compiler.generative.pass_list import decoder_pass_options
from aotforge.compiler.generative.quality import BYTE_RULE, byte_ids, default_corpus
from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import OptionsError, ValidationFailedError
from aotforge.passes.quantize_weight_only import DECODER_INT4_METHOD
from tests.llm_models import build_text_generation, tiny_llama

#: A budget no int4 build of a random tiny model should reach (its perplexity is near the vocabulary's).
GENEROUS = 10.0


@pytest.mark.parametrize(
    ("precision", "passes", "params"),
    [
        ("int4", ("weight-only",), {"weight-only": {"method": DECODER_INT4_METHOD}}),
        ("int8", ("weight-only",), {"weight-only": {"bits": 8}}),
        ("fp32", (), {}),
    ],
)
def test_precision_spells_the_decoder_passes(precision: str, passes: tuple[str, ...], params: dict[str, Any]) -> None:
    """The default preset (O1) is dropped, int4 is calibrated by the default method and int8 is weight-only at 8 bits:
    what --precision means for a decoder."""
    opts = decoder_pass_options(BuildOptions.from_dict({"precision": precision}))
    assert opts.passes.names == passes and opts.passes.params == params


def test_a_users_int4_method_is_kept() -> None:
    given = {"precision": "int4", "pass_opt": ["weight-only.method=rtn"]}
    assert decoder_pass_options(BuildOptions.from_dict(given)).passes.params == {"weight-only": {"method": "rtn"}}


def test_precision_int8_keeps_the_users_weight_only_params() -> None:
    given = {"precision": "int8", "pass_opt": ["weight-only.block_size=64"]}
    opts = decoder_pass_options(BuildOptions.from_dict(given))
    assert opts.passes.params == {"weight-only": {"bits": 8, "block_size": "64"}}


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"precision": "int8", "pass_opt": ["weight-only.bits=4"]}, "disagree: use --precision int4"),
        ({"passes": ["weight-only", "int8"]}, "both set a text-generation build's precision"),
        ({"precision": "int8", "pass_opt": ["int8.method=percentile"]}, "not int8.KEY"),
    ],
)
def test_contradictory_decoder_precisions_are_refused(given: dict[str, Any], match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        decoder_pass_options(BuildOptions.from_dict(given))


def test_the_default_corpus_is_english_from_the_stdlib() -> None:
    text = default_corpus()
    assert len(text) > 20_000 and "Return" in text
    assert byte_ids("é", 200) == [0xC3 % 200, 0xA9 % 200] and "modulo" in BYTE_RULE


def _quality(result: Any) -> dict[str, Any]:
    validation = result.manifest.validation
    assert validation["passed"] and validation["gated"] is False  # token agreement is reported, not gated
    assert 0 <= validation["token_agreement"] <= 1
    return dict(validation["quality"])


#: tvm's int4 decoder (its own export and compile) is slow here: the default int4 calibration packed by tvm, its
#: record and its quality are tests/test_weight_only_tvm.py's test_tiny_llama_int4_through_tvm, the calibrated mixed
#: bits on tvm tests/test_weight_calibration.py's; what this test reads (the manifest's records) is the compiler's.
@pytest.mark.parametrize("target", ["onnxruntime", pytest.param("tvm", marks=pytest.mark.slow)])
def test_precision_int4_builds_a_decoder_gated_on_quality(target: str, llama_dir: Path, tmp_path: Path) -> None:
    """Before: refused ("passes fold, dce do not apply to text-generation builds"). The budget is generous: a random
    model's perplexity moves either way under int4; the figures are what the manifest must carry. The weights are
    calibrated by the default method first, each matmul's method recorded."""
    result = build_text_generation(
        llama_dir, tmp_path, target=target, precision="int4", max_perplexity_increase=GENEROUS, plots=False
    )
    calibration, *packing = result.manifest.passes
    assert calibration["name"] == "calibrate-int4" and calibration["stats"]["method"] == DECODER_INT4_METHOD
    methods = calibration["stats"]["method_by_matmul"]
    assert len(methods) == 15 and sum(m == DECODER_INT4_METHOD for m in methods.values()) == 14  # the head: rtn
    assert all(p["params"]["bits"] == 4 and p["params"]["head_bits"] == 8 for p in packing)
    assert all(p["stats"]["head_bits"] == 8 for p in packing)  # the head at 8 bits by default
    quality = _quality(result)
    assert quality["perplexity"] > 1 and quality["reference_perplexity"] > 1 and quality["mean_kl"] > 0
    want = quality["perplexity"] / quality["reference_perplexity"] - 1
    assert quality["perplexity_increase"] == pytest.approx(want, abs=1e-5)
    assert quality["tokenization"] == BYTE_RULE and quality["scored_tokens"] > 1000
    assert quality["max_perplexity_increase"] == GENEROUS


def test_precision_int8_builds_a_decoder_close_to_fp32(llama_dir: Path, tmp_path: Path) -> None:
    """int8 weight-only keeps a random tiny model within the default budget (+5%), on the user's own text."""
    text = tmp_path / "eval.txt"
    text.write_text(default_corpus()[-6000:], encoding="utf-8")
    result = build_text_generation(llama_dir, tmp_path / "out", precision="int8", eval_text=text, plots=False)
    assert [p["params"]["bits"] for p in result.manifest.passes] == [8, 8]
    quality = _quality(result)
    assert quality["corpus"] == str(text) and abs(quality["perplexity_increase"]) < 0.05


def test_a_build_over_the_quality_budget_fails_and_names_the_knobs(tmp_path: Path) -> None:
    """A near-uniform tiny model (transformers' default initializer): int4 noise in its logits (rounded to nearest,
    uncalibrated) can only raise its perplexity on average, which a 0.1% budget refuses; nothing is stored."""
    out = tmp_path / "out"
    with pytest.raises(ValidationFailedError) as failed:
        build_text_generation(
            tiny_llama(initializer_range=0.02),
            out,
            precision="int4",
            pass_opt=["weight-only.method=rtn"],
            max_perplexity_increase=0.001,
            plots=False,
        )
    message = str(failed.value)
    assert "quality budget --max-perplexity-increase 0.001" in message and "mean KL" in message
    assert "block_size" in message and "--precision int8" in message and "head" in message
    assert "method=awq+gptq" in message and "aotforge qat" in message
    assert "miscompiles" not in message
    assert not any(p.is_file() for p in out.rglob("*"))


def test_fp32_builds_keep_the_token_exact_gate(llama_ort: Any) -> None:
    validation = llama_ort.manifest.validation
    assert "quality" not in validation and "gated" not in validation
    assert validation["min_token_agreement"] == 1.0 and validation["token_agreement"] == 1.0
