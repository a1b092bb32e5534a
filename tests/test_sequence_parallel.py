"""Sequence parallelism on top of tensor parallelism (``--tensor-parallel 2 --sequence-parallel``).

Each rank's prefill graph splits the residual stream and the norms along the prompt (reduce-scatter after each
row-parallel projection and the embedding, all-gather after each norm), its decode graph keeps the all-reduce;
generation is token-exact against transformers and the unsharded artifact on prompts whose length 2 does not
divide, or that are shorter than the degree. The Llama runs by default; Qwen2 and GPT-2 are slow.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import aotforge
from aotforge.core.errors import OptionsError
from tests.llm_models import (
    PROMPTS,
    assert_generates_like_transformers,
    assert_python_collectives_token_exact,
    build_text_generation,
    tiny_causal_lm,
)

DEGREE = 2
ARCHS = ["llama", pytest.param("qwen2", marks=pytest.mark.slow), pytest.param("gpt2", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=ARCHS)
def sp_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``(architecture, model, build result, its progress lines)`` at tensor parallelism 2 with the
    sequence-parallel prefill; the Llama's after conftest's plain ``llama_tp``, whose decode graphs it shares."""
    arch = request.param
    model = tiny_causal_lm(arch)
    out = tmp_path_factory.mktemp(f"sp-{arch}")
    if arch == "llama":
        request.getfixturevalue("llama_tp")
    said: list[str] = []
    result = build_text_generation(model, out, tensor_parallel=DEGREE, sequence_parallel=True, progress=said.append)
    return arch, model, result, said


@pytest.fixture(scope="module")
def sp_loaded(sp_build: Any) -> Any:
    loaded = aotforge.load(sp_build[2].path)
    yield loaded
    loaded._generative().engine.close()


def test_sequence_parallel_ranks_generate_token_exact_like_transformers(sp_build: Any, sp_loaded: Any) -> None:
    _, model, result, _ = sp_build
    tp = result.manifest.target.info["tensor_parallel"]
    assert tp["degree"] == DEGREE and tp["sequence_parallel"] is True
    assert result.manifest.validation["token_agreement"] == 1.0  # its prompts of 5, 11 and 17 tokens
    assert result.manifest.validation["max_logits_rel_l2"] < 1e-4
    assert_generates_like_transformers(sp_loaded, model)  # a batch of 7 and 3 tokens, left-padded


def _collectives(path: Path) -> Counter[str]:
    graph = onnx.load(path, load_external_data=False).graph
    return Counter(n.op_type for n in graph.node if n.domain == "ai.onnx.contrib")


def test_prefill_reduce_scatters_and_gathers_while_decode_all_reduces(sp_build: Any) -> None:
    _, model, result, _ = sp_build
    edges = 2 * model.config.num_hidden_layers + 1  # two row-parallel outputs a layer, and the embedding
    for rank in result.manifest.target.info["tensor_parallel"]["ranks"]:
        folder = Path(result.path) / rank
        assert _collectives(folder / "prefill.onnx") == {"ReduceScatter": edges, "AllGather": edges}
        assert _collectives(folder / "decode.onnx") == {"AllReduce": edges}


# The plain tensor-parallel artifact built once a run is the Llama's (llama_tp).
@pytest.mark.parametrize("sp_build", ["llama"], indirect=True)
def test_only_the_prefill_is_exported_the_decode_graphs_are_the_plain_ranks(sp_build: Any) -> None:
    """A rank's decode graph keeps the all-reduce, so it is the plain rank's: read back from the plain build's
    export, while the split prefill is exported for sequence parallelism."""
    *_, said = sp_build
    for rank in range(DEGREE):
        assert f"exporting rank {rank} of {DEGREE}: the prefill graph" in said, said
        hit = f"skipping the export of tensor_parallel shard {rank} of the decode graph"
        assert any(line.startswith("export cache hit") and line.endswith(hit) for line in said), said
    assert not any("the decode graph" in line and line.startswith("exporting") for line in said), said


# The unsharded artifact built once a run is the Llama's (llama_ort).
@pytest.mark.parametrize("sp_build", ["llama"], indirect=True)
@pytest.mark.parametrize("length", [1, 2, 3, 7])
def test_logits_match_the_unsharded_artifact_at_any_prompt_length(
    sp_build: Any, sp_loaded: Any, llama_ort: Any, length: int
) -> None:
    """A prompt shorter than the degree (rank 1 holds only padding), as long as it, and not divisible by it."""
    sharded, whole = sp_loaded._generative().engine, aotforge.load(llama_ort.path)._generative().engine
    prompt = np.array([PROMPTS[0][:length]], dtype=np.int64)
    logits = []
    for engine in (sharded, whole):
        engine.start(1, length)
        steps = [engine.prefill(prompt, np.ones_like(prompt), np.arange(length)[None, :]).copy()]
        for i, token in enumerate([3, 77, 410]):
            steps.append(engine.decode(np.array([[token]]), np.array([length + i])).copy())
        logits.append(np.concatenate(steps))
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).all()


@pytest.mark.slow  # the collectives' Python fallback is tested on its own in test_native_all_reduce.py
@pytest.mark.parametrize("sp_build", ["llama"], indirect=True)
def test_without_a_compiler_the_python_collectives_run_token_exact(
    sp_build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model, result, _ = sp_build

    assert_python_collectives_token_exact(result.path, model, monkeypatch)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"--sequence-parallel splits the prefill of tensor-parallel ranks.*add --tensor-parallel N"),
        ({"tensor_parallel": 1}, r"--sequence-parallel .*add --tensor-parallel N \(N >= 2\)"),
        ({"tensor_parallel": 2, "target": "tvm"}, r"--tensor-parallel: tvm has no rank runtime"),
    ],
    ids=["alone", "one-rank", "tvm"],
)
def test_sequence_parallel_is_refused_where_it_cannot_apply(
    options: dict[str, Any], message: str, llama_dir: Path, tmp_path: Path
) -> None:
    options = {"target": "onnxruntime", **options}
    with pytest.raises(OptionsError, match=message):
        aotforge.build(llama_dir, task="text-generation", out=tmp_path, sequence_parallel=True, **options)
    assert not any(tmp_path.rglob("manifest.json"))


@pytest.mark.slow
def test_sequence_parallel_prefill_matches_tensor_parallel_alone(sp_build: Any, sp_loaded: Any, tmp_path: Path) -> None:
    """Against the same model's plain tensor-parallel artifact: the same greedy tokens and the same prefill logits,
    bit for bit: the reduce-scatter sums each position's rows in the all-reduce's rank order, and every op between
    it and the all-gather works row by row."""
    _, model, _, _ = sp_build
    plain = aotforge.load(build_text_generation(model, tmp_path, tensor_parallel=DEGREE).path)
    try:
        engines = (sp_loaded._generative().engine, plain._generative().engine)
        prompt = np.array([PROMPTS[0]], dtype=np.int64)
        logits = []
        for engine in engines:
            engine.start(1, prompt.shape[1])
            logits.append(engine.prefill(prompt, np.ones_like(prompt), np.arange(prompt.shape[1])[None, :]).copy())
        np.testing.assert_array_equal(logits[0], logits[1])
        ids = np.array([PROMPTS[0]], dtype=np.int64)
        np.testing.assert_array_equal(
            sp_loaded.generate(ids, 12, ignore_eos=True), plain.generate(ids, 12, ignore_eos=True)
        )
    finally:
        plain._generative().engine.close()
