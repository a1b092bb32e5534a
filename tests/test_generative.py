"""Text-generation artifacts: prefill + decode graphs, generate / stream, token-exact vs transformers."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.cli import main
from aotforge.core.errors import InputSpecError, OptionsError, UnsupportedModelError
from tests.llm_models import (
    ARCHITECTURES,
    MAX_SEQ,
    NEW,
    PROMPTS,
    VOCAB,
    assert_build_token_exact,
    left_padded,
    save_tiny_causal_lm,
    tiny_causal_lm,
    transformers_greedy,
)
from tests.llm_models import build_text_generation as _build

# ``llama_ort`` (tests/conftest.py): the tiny Llama directory built for onnxruntime, benchmark included.


def test_llama_directory_batch_is_token_exact_against_transformers(llama_ort: Any) -> None:
    assert_build_token_exact(llama_ort, tiny_causal_lm("llama"))


#: Each export costs ~25 s on 2 busy cores: Llama runs by default (above), the others behind slow.
@pytest.mark.slow
@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "llama"] + ["llama-tied"])
def test_greedy_batch_is_token_exact_against_transformers(arch: str, tmp_path: Path) -> None:
    """Each architecture, built from the module itself."""
    model = tiny_causal_lm(arch)
    assert_build_token_exact(_build(model, tmp_path, name=arch), model)


def test_one_token_prompt_beside_a_long_one(llama_ort: Any) -> None:
    """Prefill's attention over prompts of 1 and 11 tokens in one batch (the short one padded over 10 positions
    whose keys/values decode then overwrites): each row as transformers generates it alone."""
    prompts = ([PROMPTS[1][0]], PROMPTS[0] + PROMPTS[1][:1] + [9, 10, 11])
    ids, mask = left_padded(prompts)
    out = aotforge.load(llama_ort.path).generate(ids, 8, attention_mask=mask)
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


def test_stops_at_eos_per_sequence(llama_ort: Any) -> None:
    artifact = aotforge.load(llama_ort.path)
    ids, mask = left_padded()
    free = artifact.generate(ids, NEW, attention_mask=mask)[:, ids.shape[1] :]
    eos = int(free[0, 3])  # the first sequence emits it at step 3 (or before)
    out = artifact.generate(ids, NEW, attention_mask=mask, eos_token_id=eos)[:, ids.shape[1] :]
    first_stop = [int(np.argmax(row == eos)) if (row == eos).any() else None for row in free]
    steps = out.shape[1]
    assert steps == max(s + 1 if s is not None else NEW for s in first_stop)
    for row, stop in enumerate(first_stop):
        if stop is None:
            np.testing.assert_array_equal(out[row], free[row, :steps])
        else:
            np.testing.assert_array_equal(out[row, : stop + 1], free[row, : stop + 1])
            assert (out[row, stop:] == eos).all(), "a finished sequence repeats eos"


def test_end_of_cache_is_a_clear_error(llama_ort: Any) -> None:
    artifact = aotforge.load(llama_ort.path)
    with pytest.raises(InputSpecError, match="max_seq_len=64"):
        artifact.generate(np.arange(60)[None, :], 6)
    # Exactly full is fine: 60 + 5 new tokens write 64 positions.
    assert artifact.generate(np.arange(60)[None, :], 5).shape == (1, 65)
    with pytest.raises(InputSpecError, match="max_batch 2"):
        artifact.generate(np.zeros((3, 4), dtype=np.int64), 2)


def test_seeded_sampling_is_reproducible(llama_ort: Any) -> None:
    artifact = aotforge.load(llama_ort.path)
    ids, mask = left_padded()
    kw = {"attention_mask": mask, "do_sample": True, "top_k": 50, "top_p": 0.9, "temperature": 1.3}
    a = artifact.generate(ids, NEW, seed=7, **kw)
    np.testing.assert_array_equal(a, artifact.generate(ids, NEW, seed=7, **kw))
    assert not np.array_equal(a, artifact.generate(ids, NEW, seed=8, **kw))
    assert not np.array_equal(a, artifact.generate(ids, NEW, attention_mask=mask))
    top1 = artifact.generate(ids, NEW, attention_mask=mask, do_sample=True, top_k=1, seed=3)
    np.testing.assert_array_equal(top1, artifact.generate(ids, NEW, attention_mask=mask))


def test_stream_yields_what_generate_returns(llama_ort: Any) -> None:
    artifact = aotforge.load(llama_ort.path)
    ids, mask = left_padded()
    steps = list(artifact.stream(ids, NEW, attention_mask=mask))
    assert len(steps) == NEW and all(s.shape == (2,) for s in steps)
    np.testing.assert_array_equal(np.stack(steps, axis=1), artifact.generate(ids, NEW, attention_mask=mask)[:, -NEW:])


def test_kv_cache_is_not_reallocated_per_token(llama_ort: Any) -> None:
    """ORT writes every step's present_* into the buffers allocated at the start of the call."""
    artifact = aotforge.load(llama_ort.path)
    engine = artifact._generative().engine
    ids, mask = left_padded()
    seen = []
    for _ in artifact.stream(ids, NEW, attention_mask=mask):
        if engine._binding is not None and len(seen) < NEW - 1:
            seen.append((engine.buffer_pointers(), engine.cache_pointers()))
    first_buffers = seen[0][0]
    cache_ids = [id(b) for b in engine.cache]
    for buffers, written in seen[1:]:
        assert buffers == first_buffers, "the cache buffers moved"
        assert written == first_buffers, "ORT wrote present_* somewhere else than the bound cache"
    assert cache_ids == [id(b) for b in engine.cache]
    assert len(engine.cache) == 2 * 2 and engine.cache[0].shape == (2, 2, MAX_SEQ, 16)


def test_cli_generate(llama_ort: Any) -> None:
    runner, path = CliRunner(), str(llama_ort.path)
    ran = runner.invoke(main, ["generate", path, "--prompt-ids", "1,2,3", "--max-new-tokens", "12"])
    assert ran.exit_code == 0, ran.output
    tokens = [int(t) for t in ran.output.split()]
    want = aotforge.load(path).generate(np.array([[1, 2, 3]]), 12)[0, 3:].tolist()
    assert tokens == want and all(0 <= t < VOCAB for t in tokens)
    too_long = runner.invoke(main, ["generate", path, "--prompt-ids", "1,2,3", "--max-new-tokens", "63"])
    assert too_long.exit_code != 0 and "max_seq_len=64" in too_long.output
    no_text = runner.invoke(main, ["generate", path, "--prompt", "hello"])
    assert no_text.exit_code != 0 and "no tokenizer" in no_text.output


def test_cli_perplexity_equals_torch_on_the_same_windows(llama_ort: Any, tmp_path: Path) -> None:
    """``aotforge perplexity`` (prefill + decode steps, windows batched) == torch's full-sequence forward."""
    from aotforge.core.errors import EXIT_VALIDATION
    from tests.lm_pair import torch_perplexity

    ids = np.random.default_rng(1).integers(0, VOCAB, size=150).tolist()
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ids)))
    runner, path = CliRunner(), str(llama_ort.path)
    ran = runner.invoke(main, ["perplexity", path, "--ids-file", str(tmp_path / "ids.txt"), "--window", "40", "--json"])
    assert ran.exit_code == 0, ran.output
    got = json.loads(ran.output)
    assert (got["windows"], got["scored_tokens"]) == (4, 3 * 39 + 29)
    want = torch_perplexity(tiny_causal_lm("llama"), ids, window=40)
    assert got["perplexity"] == pytest.approx(want, rel=1e-4)
    gate = ["perplexity", path, "--ids-file", str(tmp_path / "ids.txt"), "--max-perplexity", "1.5"]
    gated = runner.invoke(main, gate)
    assert gated.exit_code == EXIT_VALIDATION and "above --max-perplexity 1.5" in gated.output, gated.output
    too_wide = runner.invoke(main, ["perplexity", path, "--ids-file", str(tmp_path / "ids.txt"), "--window", "66"])
    assert too_wide.exit_code != 0 and "use a window of 2 to 65" in too_wide.output
    no_text = runner.invoke(main, ["perplexity", path, "--text-file", str(tmp_path / "ids.txt")])
    assert no_text.exit_code != 0 and "no tokenizer" in no_text.output


@pytest.mark.slow
def test_cli_compile(tmp_path: Path) -> None:
    model_dir = save_tiny_causal_lm("llama-tied", tmp_path / "tied")
    args = ["compile", str(model_dir), "--task", "text-generation", "--target", "onnxruntime"]
    args += ["--max-seq-len", "48", "--max-batch", "1", "--no-bench", "--out", str(tmp_path / "out")]
    built = CliRunner().invoke(main, args)
    assert built.exit_code == 0, built.output
    path = Path(built.output.strip().splitlines()[-1])
    assert json.loads((path / "manifest.json").read_text())["target"]["info"]["decoder"]["max_seq_len"] == 48
    assert "greedy tokens vs transformers: 100.0% agree" in built.output


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


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_decode_matches_the_masked_graph(arch: str) -> None:
    """The GroupQueryAttention decode (eager reference of aotforge::slot_gqa) equals the masked graph: same
    logits, the same cache at every filled position, two slots at different positions."""
    import torch

    from aotforge.compiler.generative.export import decoder_spec
    from aotforge.compiler.generative.graphs import Decode

    model = tiny_causal_lm(arch)
    spec = decoder_spec(model, 32, 2)
    torch.manual_seed(1)
    cache = [torch.randn(2, spec.kv_heads, 32, spec.head_dim) for _ in range(2 * spec.layers)]
    write_pos, ids = torch.tensor([5, 9]), torch.tensor([[3], [7]])
    with torch.no_grad():
        masked = Decode(model)(ids, write_pos[:, None], write_pos, *cache)
        fused = Decode(model, fused_attention=True)(ids, write_pos[:, None], write_pos, *cache)
    torch.testing.assert_close(fused[0], masked[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(fused[1:], masked[1:], strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_prefill_matches_the_masked_graph(arch: str) -> None:
    """The GroupQueryAttention prefill (eager reference of aotforge::prompt_gqa) equals the masked graph on two
    right-padded prompts: the same last-token logits, the same keys/values at every real position."""
    import torch

    from aotforge.compiler.generative.graphs import Prefill

    model = tiny_causal_lm(arch)
    ids = torch.tensor([PROMPTS[0][:6], PROMPTS[0][2:6] + [0, 0]])
    mask = torch.tensor([[1] * 6, [1] * 4 + [0, 0]])
    pos = torch.arange(6).repeat(2, 1)
    with torch.no_grad():
        masked = Prefill(model)(ids, mask, pos)
        fused = Prefill(model, fused_attention=True)(ids, mask, pos)
    torch.testing.assert_close(fused[0], masked[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(fused[1:], masked[1:], strict=True):
        torch.testing.assert_close(a[0], b[0])
        torch.testing.assert_close(a[1, :, :4], b[1, :, :4])


def test_onnxruntime_decode_runs_group_query_attention(llama_ort: Any) -> None:
    import onnx

    decode = onnx.load(llama_ort.path / "decode.onnx", load_external_data=False)
    ops = {(n.domain, n.op_type) for n in decode.graph.node}
    assert ("com.microsoft", "GroupQueryAttention") in ops and ("", "ScatterElements") not in ops
    assert llama_ort.manifest.target.info["decode_attention"] == "gqa"


def test_onnxruntime_graphs_run_fused_contrib_ops(llama_ort: Any) -> None:
    """The onnxruntime graphs run ORT's contrib ops (the token-exact tests above run these graphs): RMSNorm and
    residual + RMSNorm fused, q / k / v and gate / up each one MatMul over weights stored side by side (the same
    bytes in both graphs: stored once), attention one GroupQueryAttention per layer (over the prompt in prefill,
    no past), rotary inside it (do_rotary, packed QKV, the graph's position_ids), its output into o_proj with no
    Reshape; no standard-op spelling is left.
    """
    import onnx

    layers = tiny_causal_lm("llama").config.num_hidden_layers
    for graph in ("prefill", "decode"):
        model = onnx.load(llama_ort.path / f"{graph}.onnx", load_external_data=False)
        ops = collections.Counter(n.op_type for n in model.graph.node)
        assert ops["GroupQueryAttention"] == layers and ops["SkipSimplifiedLayerNormalization"] == 2 * layers
        assert ops["SimplifiedLayerNormalization"] == 1
        unfused = {"Pow", "Sqrt", "Reciprocal", "Neg", "Cos", "Sin", "Softmax", "RotaryEmbedding"} & set(ops)
        assert not unfused, sorted(ops.items())
        fused = llama_ort.manifest.target.info["fusions"][graph]
        assert fused == {
            "packed_matmuls": 5 * layers,
            "rotary_embedding": 2 * layers,
            "rms_normalization": 2 * layers + 1,
            "skip_rms_normalization": 2 * layers,
            "rotary_in_attention": layers,
            "packed_qkv_attention": layers,
            "identity_reshapes": layers,
        }
        assert ops["Reshape"] == (1 if graph == "prefill" else 0)  # prefill: the last token's index
        for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
            assert node.input[1:3] == ["", ""] and node.input[9] == "position_ids"
            past = node.input[3:5]
            assert past == ["", ""] if graph == "prefill" else past[0].startswith("past_key_"), past
            assert {a.name: a.i for a in node.attribute}["do_rotary"] == 1
            assert next(n.op_type for n in model.graph.node if node.input[0] in n.output) == "MatMul"


@pytest.mark.slow  # three builds of the tiny Llama (about a minute on a quiet 2-core machine)
def test_weight_only_int8_on_both_graphs(tmp_path: Path) -> None:
    """The weight-only pass runs on prefill and decode; the quantized weights are still stored once, the
    manifest records each graph's pass and the token agreement; a tolerance the numerics miss fails."""
    import onnx

    from aotforge.core.errors import ValidationFailedError

    model = tiny_causal_lm("llama")
    quant = {"passes": ["weight-only"], "pass_params": {"weight-only": {"bits": 8}}}
    # int8 activations (the text-generation default) put this random model's worst step at rel L2 0.105
    result = _build(model, tmp_path / "ok", tolerance=0.2, min_token_agreement=0.5, **quant)
    decode = onnx.load(result.path / "decode.onnx", load_external_data=False)
    assert any(n.op_type == "MatMulNBits" for n in decode.graph.node)
    passes = result.manifest.passes
    assert [(p["name"], p["graph"]) for p in passes] == [("weight-only", "prefill"), ("weight-only", "decode")]
    assert all(p["stats"]["nodes_quantized"] > 0 for p in passes)
    # int8 activations unless the user sets the level (ort_engine.PASS_DEFAULTS), recorded with the parameters
    assert {p["params"]["accuracy_level"] for p in passes} == {4}
    assert {a.i for n in decode.graph.node for a in n.attribute if a.name == "accuracy_level"} == {4}
    weights = result.manifest.target.info["weights"]
    assert weights["weights_file_bytes"] < 0.6 * weights["unshared_bytes"]
    assert result.manifest.validation["token_agreement"] >= 0.5
    ids = np.array([PROMPTS[0]])
    assert aotforge.load(result.path).generate(ids, 5).shape == (1, len(PROMPTS[0]) + 5)
    with pytest.raises(ValidationFailedError, match="agrees with transformers"):
        _build(model, tmp_path / "strict", tolerance=1e-9, **quant)
    with pytest.raises(OptionsError, match="text-generation builds"):
        _build(model, tmp_path / "int8", passes=["int8-dynamic"])
