"""Tensor-parallel text-generation artifacts (``--tensor-parallel 2``) on the tiny Llama (GQA), Qwen2 and GPT-2.

Each artifact holds two rank graphs over half of the weights and half of the KV heads; its ranks run as two
processes that all-reduce through shared memory, and whatever drives them (``generate``, the serving runtime)
gets tokens identical to the unsharded model's. A killed rank fails its requests with an error naming it, and
the next requests run on restarted ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import aotforge
from aotforge.artifacts.engine_loader import load_engine
from aotforge.core.errors import OptionsError
from aotforge.runtime.engine import LLMEngine
from aotforge.runtime.params import EngineConfig, SamplingParams
from tests.llm_models import (
    ARCHITECTURES,
    MAX_BATCH,
    PROMPTS,
    assert_generates_like_transformers,
    assert_python_collectives_token_exact,
    build_text_generation,
    tiny_causal_lm,
    transformers_greedy,
)

DEGREE = 2


#: Qwen2 at two ranks is slow: its layers are the Llama's (GQA, split by KV-head groups) with Q/K/V biases, which
#: the ranks split as they split those projections' rows, and GPT-2's case splits biases (its fused c_attn's) too.
RANKED = [pytest.param(a, marks=pytest.mark.slow) if a == "qwen2" else a for a in ARCHITECTURES]


@pytest.fixture(scope="module", params=RANKED)
def tp_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``(architecture, model, build result)`` of each tiny model at tensor parallelism 2 (the Llama with a verify
    graph, so the serving runtime can extend a prompt in chunks: conftest's ``llama_tp``)."""
    arch = request.param
    model = tiny_causal_lm(arch)
    if arch == "llama":
        return arch, model, request.getfixturevalue("llama_tp")
    return arch, model, build_text_generation(model, tmp_path_factory.mktemp(f"tp-{arch}"), tensor_parallel=DEGREE)


@pytest.fixture(scope="module")
def tp_loaded(tp_build: Any) -> Any:
    """The artifact loaded once (its two rank processes), shared by the tests that only drive it."""
    loaded = aotforge.load(tp_build[2].path)
    yield loaded
    loaded._generative().engine.close()


def test_rank_artifacts_generate_token_exact_like_transformers(tp_build: Any, tp_loaded: Any) -> None:
    _, model, result = tp_build
    assert result.manifest.target.info["tensor_parallel"]["degree"] == DEGREE
    assert result.manifest.validation["token_agreement"] == 1.0
    assert result.manifest.validation["max_logits_rel_l2"] < 1e-4
    assert_generates_like_transformers(tp_loaded, model)
    # the native all-reduce on a host with a C compiler (the Python op otherwise: tested below)
    collective = tp_loaded._generative().engine.group.collective
    assert collective == "native" if shutil.which("gcc") else collective.startswith("python op")


# The unsharded artifact built once a run is the Llama's (llama_ort).
@pytest.mark.parametrize("tp_build", ["llama"], indirect=True)
def test_logits_match_the_unsharded_artifact_within_fp32_summation_order(
    tp_build: Any, tp_loaded: Any, llama_ort: Any
) -> None:
    sharded, whole = tp_loaded._generative().engine, aotforge.load(llama_ort.path)._generative().engine
    prompt = np.array([PROMPTS[0]], dtype=np.int64)
    logits = []
    for engine in (sharded, whole):
        engine.start(1, prompt.shape[1])
        steps = [engine.prefill(prompt, np.ones_like(prompt), np.arange(prompt.shape[1])[None, :]).copy()]
        for i, token in enumerate([3, 77, 410, 12]):
            steps.append(engine.decode(np.array([[token]]), np.array([prompt.shape[1] + i])).copy())
        logits.append(np.concatenate(steps))
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).all()


#: Parameters every rank holds whole: norms, GPT-2's position table, the row-parallel layers' biases.
REPLICATED = ("norm", "ln_", "wpe", "o_proj.bias", "down_proj.bias", "c_proj.bias")


def _rank_share(model: Any) -> tuple[int, int]:
    """``(bytes a rank stores, parameters stored)`` if each holds 1/DEGREE of the split parameters and the whole of
    the replicated ones; tensors under ``save_shared``'s 1 KiB stay inside the graphs, not the weight file."""
    share = [p.numel() * 4 // (1 if any(k in n for k in REPLICATED) else DEGREE) for n, p in model.named_parameters()]
    stored = [b for b in share if b >= 1024]  # named_parameters lists tied weights once
    return sum(stored), len(stored)


def test_each_rank_holds_one_nth_of_the_weights_and_kv_heads(tp_build: Any) -> None:
    _, model, result = tp_build
    path, tp = Path(result.path), result.manifest.target.info["tensor_parallel"]
    share, tensors = _rank_share(model)
    spec = result.manifest.target.info["decoder"]
    for rank in tp["ranks"]:
        stored = (path / rank / "weights.data").stat().st_size
        # save_shared pads each tensor to a page; RoPE tables and the like are stored too, a few pages
        assert share <= stored <= share + 4096 * (tensors + 8)
        past = {i.name: i for i in onnx.load(path / rank / "decode.onnx", load_external_data=False).graph.input}
        dims = [d.dim_value for d in past["past_key_0"].type.tensor_type.shape.dim[1:]]
        assert dims == [spec["kv_heads"] // DEGREE, spec["max_seq_len"], spec["head_dim"]]
    assert tp["decoder"]["kv_heads"] * DEGREE == spec["kv_heads"]


# One serving run: the Llama, whose verify graph lets prompts go in chunks.
@pytest.mark.parametrize("tp_build", ["llama"], indirect=True)
def test_serving_runtime_drives_the_ranks_token_exact(tp_build: Any, tp_loaded: Any) -> None:
    _, model, _ = tp_build
    runner = tp_loaded._generative().engine.model_runner(MAX_BATCH)  # the same ranks, a cache of their own
    engine = LLMEngine(runner, EngineConfig(max_num_seqs=MAX_BATCH, max_num_batched_tokens=8))
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0][:5] + [11, 12, 13, 14, 15, 16]]
    want = {f"r{i}": transformers_greedy(model, p, 10) for i, p in enumerate(prompts)}
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=10, temperature=0))
    got: dict[str, list[int]] = {k: [] for k in want}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
            got[out.request_id] += out.token_ids
    assert got == want


# Rank failure is the runtime's, the same for every architecture.
@pytest.mark.parametrize("tp_build", ["llama"], indirect=True)
def test_a_killed_rank_fails_its_requests_and_the_next_ones_run_on_restarted_ranks(tp_build: Any) -> None:
    _, model, result = tp_build
    # Blocks of 4 positions: the first request's prompt leaves a cached block that a stale cache would hand on.
    engine, _, _ = load_engine(Path(result.path), EngineConfig(max_num_seqs=MAX_BATCH, block_size=4))
    try:
        engine.eos_token_ids = frozenset()
        engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=30, temperature=0))
        assert engine.step()[0].error is None  # the prompt and its first token
        group = engine.runner.engine.group
        os.kill(group.workers.procs[1].pid, signal.SIGKILL)
        errors = [out.error for _ in range(3) for out in engine.step() if out.error]
        assert errors and "rank 1" in errors[0] and "restarted with an empty KV cache" in errors[0]
        assert not engine.has_unfinished()
        assert not group.workers.procs, "the failed group's surviving rank was stopped"
        assert engine.runner.failure == ""
        engine.add_request("b", PROMPTS[0], SamplingParams(max_tokens=10, temperature=0))
        got: list[int] = []
        while engine.has_unfinished():
            for out in engine.step():
                assert out.error is None and out.cached_tokens == 0  # the prefix cache went with the ranks' KV
                got += out.token_ids
        assert got == transformers_greedy(model, PROMPTS[0], 10)
    finally:
        engine.runner.engine.close()


@pytest.mark.parametrize("tp_build", ["llama"], indirect=True)
def test_without_a_compiler_the_ranks_run_the_python_all_reduce_token_exact(
    tp_build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model, result = tp_build

    assert_python_collectives_token_exact(result.path, model, monkeypatch)


#: What a rank or stage process runs to supply its Python ops; then the package imported in full, as other code may.
_OPS_ALONE = """
import sys
from aotforge.targets.onnxruntime import python_ops
library, types = python_ops.library_path(), python_ops.dtypes()
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
import onnxruntime_extensions
print(heavy, library == onnxruntime_extensions.get_library_path(), types is onnxruntime_extensions.PyCustomOpDef)
"""


def test_the_shards_python_ops_load_without_torch_and_once() -> None:
    """The rank / stage processes' op registry imports neither torch nor transformers (onnxruntime-extensions'
    ``__init__`` imports both), and the package imported later reuses it: one library, one set of ops."""
    run = subprocess.run([sys.executable, "-c", _OPS_ALONE], capture_output=True, text=True, timeout=120, check=True)
    assert run.stdout.split() == ["[]", "True", "True"], run.stdout + run.stderr


def test_a_degree_that_does_not_divide_the_kv_heads_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match=r"--tensor-parallel 3 does not divide .* 2 key/value heads.*one of 1, 2"):
        build_text_generation(tiny_causal_lm("llama"), tmp_path, tensor_parallel=3)
    assert not any(tmp_path.rglob("manifest.json"))


@pytest.mark.slow
def test_real_smollm2_at_three_ranks_is_token_exact_and_refuses_two(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (3 key/value heads): degree 2 is refused, degree 3 generates as transformers does and
    each rank holds a third of the split weights."""
    from tools.real_model import smollm2_dir

    model_dir = smollm2_dir()
    with pytest.raises(OptionsError, match="does not divide .* 3 key/value heads"):
        aotforge.build(model_dir, target="onnxruntime", task="text-generation", out=tmp_path, tensor_parallel=2)
    result = aotforge.build(
        model_dir, target="onnxruntime", task="text-generation", out=tmp_path, tensor_parallel=3,
        max_seq_len=256, max_batch=1, bench=False,
    )  # fmt: skip
    assert result.manifest.validation["token_agreement"] == 1.0
    sizes = [
        (Path(result.path) / r / "weights.data").stat().st_size
        for r in result.manifest.target.info["tensor_parallel"]["ranks"]
    ]
    assert max(sizes) < 0.36 * 538e6  # a third of the 538 MB of weights, plus the replicated norms
