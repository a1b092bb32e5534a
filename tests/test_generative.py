"""Text-generation artifacts on onnxruntime: prefill + decode graphs over one weight file, the KV cache bound once
(what both CPU targets do alike: tests/test_generative_targets.py; the CLI: tests/test_generative_cli.py; the fused
attention: tests/test_generative_fusions.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.core.errors import InputSpecError, OptionsError, UnsupportedModelError
from tests.llm_models import (
    MAX_SEQ,
    NEW,
    PROMPTS,
    SPECULATIVE_K,
    left_padded,
    tiny_causal_lm,
    transformers_greedy,
)
from tests.llm_models import build_text_generation as _build

# ``llama_ort`` (tests/conftest.py): the tiny Llama directory built for onnxruntime, benchmark included.


def test_one_token_prompt_beside_a_long_one(llama_ort: Any) -> None:
    """Prefill's attention over prompts of 1 and 11 tokens in one batch (the short one padded over 10 positions
    whose keys/values decode then overwrites): each row as transformers generates it alone."""
    prompts = ([PROMPTS[1][0]], PROMPTS[0] + PROMPTS[1][:1] + [9, 10, 11])
    ids, mask = left_padded(prompts)
    out = aotforge.load(llama_ort.path).generate(ids, 8, attention_mask=mask, ignore_eos=True)
    model = tiny_causal_lm("llama")
    for row, prompt in enumerate(prompts):
        assert out[row, ids.shape[1] :].tolist() == transformers_greedy(model, prompt, 8), row


def test_directory_build_shares_one_weight_file(llama_ort: Any) -> None:
    path, m = llama_ort.path, llama_ort.manifest
    assert {"prefill.onnx", "decode.onnx", "weights.data"} <= set(m.files)
    import onnx

    locations = set()
    for graph in ("prefill.onnx", "decode.onnx"):
        proto = onnx.load(path / graph, load_external_data=False)
        big = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert big, graph
        locations |= {e.value for t in big for e in t.external_data if e.key == "location"}
    assert locations == {"weights.data"}
    weights = m.target.info["weights"]
    # Both graphs hold every weight, the file holds each once (plus page alignment).
    assert weights["unshared_bytes"] > 1.8 * weights["weights_file_bytes"] - 4096 * 40
    assert weights["file"] == "weights.data" and weights["weights_file_bytes"] == m.file_sizes["weights.data"]
    assert m.source["format"] == "transformers" and m.target.info["task"] == "text-generation"


def test_benchmark_generation_record(llama_ort: Any) -> None:
    g = llama_ort.manifest.benchmark["generation"]
    assert set(g) >= {"ttft_ms", "itl_ms", "tokens_per_s", "kv_cache_bytes", "weight_bytes"}
    assert set(g["itl_ms"]) == {"p50", "p90", "p99"} and 0 < g["itl_ms"]["p50"] <= g["itl_ms"]["p99"]
    assert set(g["tokens_per_s"]) == {"1", "2"} and all(v > 0 for v in g["tokens_per_s"].values())
    assert g["kv_cache_bytes"]["2"] == 2 * 2 * 2 * 2 * MAX_SEQ * 16 * 4  # K+V, layers, batch, kv heads, dims
    assert g["weight_bytes"] == llama_ort.manifest.file_sizes["weights.data"]
    card = (llama_ort.path / "MODEL_CARD.md").read_text()
    assert "Time to first token" in card and "token for token" in card


def test_kv_cache_is_not_reallocated_per_token(llama_ort: Any) -> None:
    """ORT writes every step's present_* into the buffers the model runner allocated once (``stream`` runs on the
    runtime's engine over it)."""
    artifact = aotforge.load(llama_ort.path)
    ids, mask = left_padded()
    steps = artifact.stream(ids, NEW, attention_mask=mask, ignore_eos=True)
    runner = artifact._generative().model_runner(len(ids))  # the one this call runs on
    seen = []
    for _ in steps:
        if 2 in runner._decodes and len(seen) < NEW - 1:
            written = [value.data_ptr() for value in runner._decodes[2][0].get_outputs()[1:]]
            seen.append(([buffer.ctypes.data for buffer in runner.paged.rows], written))
    first_buffers = seen[0][0]
    cache_ids = [id(b) for b in runner.paged.rows]
    for buffers, written in seen[1:]:
        assert buffers == first_buffers, "the cache buffers moved"
        assert written == first_buffers, "ORT wrote present_* somewhere else than the bound cache"
    assert cache_ids == [id(b) for b in runner.paged.rows]
    # the working rows ORT decodes over: one per sequence and extend's, beside the pool of blocks
    assert len(runner.paged.rows) == 2 * 2 and runner.paged.rows[0].shape == (2 + 1, 2, MAX_SEQ, 16)


def test_generate_and_stream_stop_at_the_models_own_end_of_sequence_ids(tmp_path: Path) -> None:
    """A tiny Llama whose generation config names two end-of-sequence ids that its greedy paths make (one on each
    prompt's): ``generate()`` and ``stream()`` stop each row at either by default, plainly and with a draft, each
    finished row repeating its id until the last row stops; ``ignore_eos=True`` runs every row to ``max_new_tokens``
    (transformers' tokens); ``eos_token_id=`` (an id or several) stops at those instead."""
    model = tiny_causal_lm("llama")
    free = [transformers_greedy(model, prompt, NEW) for prompt in PROMPTS]
    own = {free[0][2], free[1][4]}
    model.generation_config.eos_token_id = sorted(own)
    model.save_pretrained(tmp_path / "model")
    result = _build(str(tmp_path / "model"), tmp_path / "out", speculative_k=SPECULATIVE_K)
    loaded, twin = aotforge.load(result.path), aotforge.load(result.path)
    assert loaded.eos_token_ids == own
    ids, mask = left_padded()
    ran_on = loaded.generate(ids, NEW, attention_mask=mask, ignore_eos=True)[:, ids.shape[1] :]
    assert ran_on.tolist() == free
    want = _stopped(free, own)
    assert want.shape[1] < NEW
    for kw in ({}, {"draft": twin}):
        assert loaded.generate(ids, NEW, attention_mask=mask, **kw)[:, ids.shape[1] :].tolist() == want.tolist()
        assert np.stack(list(loaded.stream(ids, NEW, attention_mask=mask, **kw)), axis=1).tolist() == want.tolist()
    alone = [int(t[0]) for t in loaded.stream(np.array([PROMPTS[1]]), NEW)]
    assert alone == _stopped([free[1]], own)[0].tolist()
    for explicit in (free[0][5], [free[0][5], free[1][1]]):
        stop = {explicit} if isinstance(explicit, int) else set(explicit)
        got = loaded.generate(ids, NEW, attention_mask=mask, eos_token_id=explicit)[:, ids.shape[1] :]
        assert got.tolist() == _stopped(free, stop).tolist(), explicit
        with_ignore = loaded.generate(ids, NEW, attention_mask=mask, eos_token_id=explicit, ignore_eos=True)
        np.testing.assert_array_equal(with_ignore[:, ids.shape[1] :], got)  # given ids stop, as serving's do


def _stopped(free: list[list[int]], stop: set[int]) -> np.ndarray:
    """Each row of ``free`` up to and including its first id in ``stop``, that id repeated until the longest row
    ends (all of ``free`` where no row stops)."""
    rows = [row[: next((i + 1 for i, t in enumerate(row) if t in stop), len(row))] for row in free]
    width = max(len(r) for r in rows)
    return np.array([r + r[-1:] * (width - len(r)) for r in rows])


def test_refusals(tmp_path: Path) -> None:
    import torch

    model = tiny_causal_lm("llama")
    with pytest.raises(OptionsError, match="passes"):
        _build(model, tmp_path, passes=["fp16"])
    with pytest.raises(UnsupportedModelError, match="not a transformers causal LM"):
        _build(torch.nn.Linear(2, 2), tmp_path)
    with pytest.raises(OptionsError, match="max_seq_len"):
        _build(model, tmp_path, max_seq_len=1)
    with pytest.raises(InputSpecError, match="not a text-generation artifact"):
        aotforge.load(_plain_onnx(tmp_path)).generate(np.zeros((1, 2), dtype=np.int64), 2)


def _plain_onnx(tmp_path: Path) -> Path:
    from tests.conftest import ONNX_LIGHT, quick_build

    return quick_build(str(ONNX_LIGHT / "light_squeezenet.onnx"), tmp_path / "plain", target="onnxruntime").path


@pytest.mark.parametrize("target", ["tensorrt", "neuron"])
def test_device_targets_refuse_with_the_probe_reason(target: str, tmp_path: Path) -> None:
    from aotforge.core.errors import TargetUnavailableError
    from aotforge.targets import get_target

    probe = get_target(target).probe()
    if probe.compiles:
        pytest.skip(f"{target} is available here: its text-generation path is not implemented yet")
    with pytest.raises(TargetUnavailableError, match=re.escape(probe.reason[:40])):
        _build(tiny_causal_lm("llama"), tmp_path, target=target)


@pytest.mark.slow  # three builds of the tiny Llama (about a minute on a quiet 2-core machine)
def test_weight_only_int8_on_both_graphs(tmp_path: Path) -> None:
    """The weight-only pass runs on prefill and decode; the quantized weights are still stored once, the
    manifest records each graph's pass, its quality and the token agreement (reported, not gated)."""
    import onnx

    model = tiny_causal_lm("llama")
    quant = {"passes": ["weight-only"], "pass_params": {"weight-only": {"bits": 8}}}
    # int8 activations (the text-generation default) move logits past fp32's tolerance: the build gates on quality
    result = _build(model, tmp_path / "ok", **quant)
    decode = onnx.load(result.path / "decode.onnx", load_external_data=False)
    assert any(n.op_type == "MatMulNBits" for n in decode.graph.node)
    passes = result.manifest.passes
    assert [(p["name"], p["graph"]) for p in passes] == [("weight-only", "prefill"), ("weight-only", "decode")]
    assert all(p["stats"]["nodes_quantized"] > 0 for p in passes)
    # int8 activations unless the user sets the level (targets.onnxruntime.decoder.PASS_DEFAULTS),
    # recorded with the parameters
    assert {p["params"]["accuracy_level"] for p in passes} == {4}
    assert {a.i for n in decode.graph.node for a in n.attribute if a.name == "accuracy_level"} == {4}
    weights = result.manifest.target.info["weights"]
    assert weights["weights_file_bytes"] < 0.6 * weights["unshared_bytes"]
    assert "token_agreement" in result.manifest.validation
    ids = np.array([PROMPTS[0]])
    assert aotforge.load(result.path).generate(ids, 5, ignore_eos=True).shape == (1, len(PROMPTS[0]) + 5)
    # Gated on quality (held-out perplexity vs fp32), the token agreement and logits only reported.
    assert result.manifest.validation["gated"] is False and "mean_kl" in result.manifest.validation["quality"]
    with pytest.raises(OptionsError, match="text-generation builds"):
        _build(model, tmp_path / "int8", passes=["int8-dynamic"])
