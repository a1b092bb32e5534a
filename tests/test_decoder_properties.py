"""Decoder configurations drawn per family (hypothesis), so that no fixed size hides a shape assumption: each
draw builds for a drawn CPU target and generates greedy tokens equal to transformers' own, or the build refuses
the model naming its family (exit 2) — never an internal error.

What a draw varies, per family: heads and KV heads (multi-query to multi-head), head_dim (apart from hidden /
heads where the family takes one), widths off the powers of two, tied or untied heads, biases, partial rotary,
rope scaling (linear, YaRN, Llama 3; dynamic within max_position_embeddings or past it, where it is refused), QK
norms, parallel residuals, post-norm, the embedding and logit multipliers, soft-capping, sliding windows shorter
or longer than the cache (on every layer, on some layer types, past ``max_window_layers``), Falcon's three block
layouts. The default run draws two (derandomized: the same two every run); ``make test-slow`` draws 25 per
family, each on a drawn target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aotforge
from aotforge.core.errors import UnsupportedModelError
from tests.llm_models import PROMPTS, TVM_BUCKETS, build_text_generation, left_padded, transformers_greedy
from tests.test_decoder_families import decoder_of

ROPE_SCALING = (
    None,
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
    {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    {"rope_type": "dynamic", "factor": 2.0},  # built within max_position_embeddings, refused past it
)
#: A sliding window shorter than the drawn builds' cache (64), or none of effect.
WINDOWS = (4, 8, 128)
FAMILIES = (
    "llama",
    "qwen2",
    "mistral",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "phi",
    "granite",
    "cohere",
    "falcon",
    "gpt2",
    "gpt_neox",
    "stablelm",
    "opt",
)


@st.composite
def configs(draw: st.DrawFn, families: tuple[str, ...] = FAMILIES) -> tuple[str, dict[str, Any]]:
    """A family (of ``families``) and config values ``decoder_of`` builds."""
    family = draw(st.sampled_from(families))
    heads = draw(st.integers(1, 6))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    head_dim = draw(st.sampled_from((8, 12, 16, 20, 24, 32, 40)))
    tied = draw(st.booleans())
    if family == "gpt2":
        return family, {"n_embd": heads * head_dim, "n_head": heads, "tie_word_embeddings": tied}
    if family == "opt":
        return family, {
            "hidden_size": heads * head_dim,
            "num_attention_heads": heads,
            "tie_word_embeddings": tied,
            "do_layer_norm_before": draw(st.booleans()),
        }
    if family == "gpt_neox":
        rope = {
            "rope_theta": 10000.0,
            "rope_type": "default",
            "partial_rotary_factor": draw(st.sampled_from((0.25, 0.5, 1.0))),
        }
        return family, {
            "hidden_size": heads * head_dim,
            "num_attention_heads": heads,
            "tie_word_embeddings": tied,
            "use_parallel_residual": draw(st.booleans()),
            "rope_parameters": rope,
        }
    if family == "falcon":
        values = {"hidden_size": heads * head_dim, "num_attention_heads": heads, "bias": draw(st.booleans())}
        layout = draw(st.sampled_from(("new", "multi-query", "multi-head")))
        if layout == "new":
            return family, {**values, "new_decoder_architecture": True, "num_kv_heads": kv}
        return family, {**values, "multi_query": layout == "multi-query", "parallel_attn": draw(st.booleans())}
    values: dict[str, Any] = {"num_attention_heads": heads, "num_key_value_heads": kv, "tie_word_embeddings": tied}
    if family in ("gemma", "gemma2", "gemma3_text", "qwen3", "llama"):  # head_dim is a config value of its own
        values["head_dim"] = head_dim
        values["hidden_size"] = heads * draw(st.integers(2, 12)) * 4  # transformers checks hidden % heads
    else:
        values["hidden_size"] = heads * head_dim
    if family in ("llama", "qwen2", "mistral"):
        scaling = draw(st.sampled_from(ROPE_SCALING))
        if scaling is not None:
            values["rope_parameters"] = {"rope_theta": 10000.0, **scaling}
        if scaling is not None and scaling["rope_type"] == "dynamic":  # within the cache's 64 or past it
            values["max_position_embeddings"] = draw(st.sampled_from((32, 64, 2048)))
    if family == "llama":
        values["attention_bias"] = draw(st.booleans())
        values["mlp_bias"] = draw(st.booleans())
    if family == "granite":
        values["embedding_multiplier"] = draw(st.sampled_from((1.0, 12.0)))
        values["logits_scaling"] = draw(st.sampled_from((1.0, 8.0)))
    if family in ("mistral", "gemma2", "gemma3_text"):
        values["sliding_window"] = draw(st.sampled_from(WINDOWS))
    if family == "qwen2" and draw(st.booleans()):
        values.update(use_sliding_window=True, sliding_window=draw(st.sampled_from(WINDOWS)))
        values["max_window_layers"] = draw(st.integers(0, 2))
    if family == "gemma2":
        values["attn_logit_softcapping"] = draw(st.sampled_from((None, 50.0)))
    if family == "gemma3_text":
        values["layer_types"] = draw(
            st.lists(st.sampled_from(("sliding_attention", "full_attention")), min_size=2, max_size=2)
        )
    if family == "cohere":
        values["use_qk_norm"] = draw(st.booleans())
        values["logit_scale"] = draw(st.sampled_from((0.0625, 0.5, 1.0)))
    if family in ("phi", "stablelm"):  # a rotary width that is even
        factors = [f for f in (0.25, 0.5, 1.0) if int(head_dim * f) % 2 == 0]
        values["partial_rotary_factor"] = draw(st.sampled_from(factors))
    if family == "phi":
        values["qk_layernorm"] = draw(st.booleans())
    if family == "stablelm":
        values.update(use_qkv_bias=draw(st.booleans()), use_parallel_residual=draw(st.booleans()))
    return family, values


def _check(family: str, values: dict[str, Any], target: str, out: Path) -> None:
    model = decoder_of(family, values)
    options = {"target_options": TVM_BUCKETS} if target == "tvm" else {}
    try:
        result = build_text_generation(model, out, target=target, name="drawn", **options)
    except UnsupportedModelError as e:  # a refusal is an answer; it must name the family
        assert family in str(e), str(e)
        return
    assert result.manifest.validation["token_agreement"] == 1.0
    ids, mask = left_padded()
    got = aotforge.load(result.path).generate(ids, 12, attention_mask=mask, ignore_eos=True)
    for row, prompt in enumerate(PROMPTS):
        assert got[row, ids.shape[1] :].tolist() == transformers_greedy(model, prompt, 12), (family, values, row)


_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]}


@settings(max_examples=2, derandomize=True, database=None, **_SETTINGS)
@given(drawn=configs(), target=st.sampled_from(("onnxruntime", "tvm")))
def test_drawn_decoders_are_token_exact_or_refused(
    drawn: tuple[str, dict[str, Any]], target: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(*drawn, target, tmp_path_factory.mktemp("drawn"))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=25, **_SETTINGS)
@given(data=st.data(), target=st.sampled_from(("onnxruntime", "tvm")))
def test_many_drawn_decoders_are_token_exact_or_refused(
    family: str, data: st.DataObject, target: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(*data.draw(configs((family,))), target, tmp_path_factory.mktemp("drawn"))


@pytest.mark.slow
def test_a_drawn_model_whose_greedy_path_picks_eos_is_token_exact(tmp_path: Path) -> None:
    """The hidden set's one mismatch (GPT-2, head_dim 40, tvm) was the reference's: its first greedy token of the
    7-token prompt is the end-of-sequence token, which ``generate(min_new_tokens=...)`` forbade."""
    _check("gpt2", {"n_embd": 200, "n_head": 5, "tie_word_embeddings": True}, "tvm", tmp_path)


def test_the_strategy_draws_every_family() -> None:
    """The strategy itself: every family it names builds models of that family (a typo would silently shrink the
    space the property covers), a few draws each."""
    for name in FAMILIES:  # each draw of configs((name,)) is of family `name`

        @settings(max_examples=4, derandomize=True, database=None, deadline=None)
        @given(drawn=configs((name,)))
        def build(drawn: tuple[str, dict[str, Any]]) -> None:
            family, values = drawn
            assert decoder_of(family, values).config.model_type == family

        build()
