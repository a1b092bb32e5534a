"""Pipeline-parallel text-generation artifacts (``--pipeline-parallel 2``) on the tiny Llama (GQA), Qwen2 and GPT-2.

Each artifact holds two stage graphs, each over its own layers (the embedding in the first, the norm and head in
the last) and a KV cache of those layers only; its stages run as two processes that hand hidden states on from
inside their graphs, the serving engine keeping a batch in flight a stage (or, one batch at a time, a decode
going through them as micro-batches), and whatever drives them (``generate``, the serving runtime) gets tokens
identical to the unsharded model's. A killed stage fails its
requests with an error naming it, and a degree above the layer count is refused.
"""

from __future__ import annotations

import os
import signal
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
    build_text_generation,
    tiny_causal_lm,
    transformers_greedy,
)

DEGREE = 2


#: Qwen2 at two stages is slow: a stage split cuts between layers, never inside one, so Qwen2's layers (the Llama's
#: with Q/K/V biases) add nothing to the Llama's stages; GPT-2's stages carry its learned positions and tied head.
STAGED = [pytest.param(a, marks=pytest.mark.slow) if a == "qwen2" else a for a in ARCHITECTURES]


@pytest.fixture(scope="module", params=STAGED)
def pp_build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``(architecture, model, build result)`` of each tiny model at pipeline parallelism 2 (the Llama with a
    verify graph, so the serving runtime can extend a prompt in chunks: conftest's ``llama_pp``)."""
    arch = request.param
    model = tiny_causal_lm(arch)
    if arch == "llama":
        return arch, model, request.getfixturevalue("llama_pp")
    return arch, model, build_text_generation(model, tmp_path_factory.mktemp(f"pp-{arch}"), pipeline_parallel=DEGREE)


@pytest.fixture(scope="module")
def pp_loaded(pp_build: Any) -> Any:
    """The artifact loaded once (its two stage processes), shared by the tests that only drive it."""
    loaded = aotforge.load(pp_build[2].path)
    yield loaded
    loaded._generative().engine.close()


def test_stage_artifacts_generate_token_exact_like_transformers(pp_build: Any, pp_loaded: Any) -> None:
    _, model, result = pp_build
    assert result.manifest.target.info["pipeline_parallel"]["degree"] == DEGREE
    assert result.manifest.validation["token_agreement"] == 1.0
    assert result.manifest.validation["max_logits_rel_l2"] < 1e-4
    assert_generates_like_transformers(pp_loaded, model)


def test_each_stage_holds_its_layers_weights_and_cache(pp_build: Any) -> None:
    _, model, result = pp_build
    path, pp = Path(result.path), result.manifest.target.info["pipeline_parallel"]
    bounds = pp["layout"]["bounds"]
    assert bounds[0] == 0 and bounds[-1] == model.config.num_hidden_layers
    vocab = result.manifest.target.info["decoder"]["vocab"]
    for s, stage in enumerate(pp["stages"]):
        graph = onnx.load(path / stage / "decode.onnx", load_external_data=False).graph
        past = sum(i.name.startswith("past_key_") for i in graph.input)
        assert past == bounds[s + 1] - bounds[s]  # the cache of its layers only
        logits = next(o for o in graph.output if o.name == "logits").type.tensor_type.shape.dim[-1].dim_value
        assert logits == (vocab if s == len(pp["stages"]) - 1 else 1)  # the head on the last stage only
    total = sum(p.numel() * 4 for p in model.parameters())
    assert sum(pp["stage_weights_bytes"].values()) < total + 64 * 4096  # no layer twice (tables, padding aside)


# The serving run one batch at a time: the Llama, whose verify graph lets prompts go in chunks; four rows in two
# micro-batches, and
# requests of different lengths, so sequences end mid-run and the others move between working rows; a step's prompt
# chunks go through the stages in the same call as its decode.
@pytest.mark.parametrize("pp_build", ["llama"], indirect=True)
def test_serving_runtime_drives_the_stages_in_micro_batches_token_exact(
    pp_build: Any, pp_loaded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model, _ = pp_build
    rows = 2 * MAX_BATCH
    runner = pp_loaded._generative().engine.model_runner(rows)  # the same stages, a cache of their own
    config = EngineConfig(max_num_seqs=rows, max_num_batched_tokens=8, max_batches_in_flight=1)
    engine = LLMEngine(runner, config)
    calls: list[tuple[str, Any]] = []
    stages_call = runner.engine.call
    monkeypatch.setattr(
        runner.engine,
        "call",
        lambda where, method, *args: calls.append((method, args)) or stages_call(where, method, *args),
    )
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0][:5] + [11, 12, 13, 14, 15, 16], [9, 8, 7], [40, 41]]
    lengths = [10, 4, 12, 6, 9]
    want = {f"r{i}": transformers_greedy(model, p, n) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))}
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, temperature=0))
    got: dict[str, list[int]] = {k: [] for k in want}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
            got[out.request_id] += out.token_ids
    assert got == want
    # Each step is one call of the stages: its prompt chunks go through them with the decode's micro-batches.
    assert {method for method, _ in calls} == {"step"}
    assert any(chunks and decode is not None for chunks, decode, _ in (args for _, args in calls))
    busy = pp_loaded._generative().engine.group.busy_seconds()
    assert len(busy) == DEGREE and all(b > 0 for b in busy)


# Two batches in flight (vLLM's virtual engines): eight requests of different prompt and output lengths, so groups
# shrink as sequences end and prompts arrive in chunks beside the other group's decodes.
@pytest.mark.parametrize("pp_build", ["llama"], indirect=True)
def test_eight_requests_in_two_batches_in_flight_match_the_unsharded_artifact(
    pp_build: Any, pp_loaded: Any, llama_ort: Any
) -> None:
    rows = 8
    runner = pp_loaded._generative().engine.model_runner(rows)
    engine = LLMEngine(runner, EngineConfig(max_num_seqs=rows, max_num_batched_tokens=16))
    assert engine.batches_in_flight == DEGREE
    prompts = [PROMPTS[0], PROMPTS[1], [9, 8, 7], [40, 41], PROMPTS[0] * 3, [3] * 11, [200, 201, 202, 203], [77]]
    lengths = [10, 4, 12, 6, 9, 3, 14, 7]
    whole = aotforge.load(llama_ort.path)
    want = {
        f"r{i}": whole.generate(np.array([p]), n, ignore_eos=True)[0, len(p) :].tolist()
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    }
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, temperature=0))
    got: dict[str, list[int]] = {k: [] for k in want}
    aborted, steps = "", 0
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
            got[out.request_id] += out.token_ids
        steps += 1
        if steps == 8:  # an abort while its batch is in flight: what that batch brings back for it is dropped
            aborted = next(seq.request_id for seq in engine.scheduler.running if seq.in_flight)
            assert engine.abort(aborted) is not None
    cut = got.pop(aborted)
    assert cut == want.pop(aborted)[: len(cut)] and len(cut) < lengths[int(aborted[1:])]
    assert got == want
    # The runner's own counters: a step went to the stages while another was still in them, two at most.
    assert runner.peak_in_flight == DEGREE
    assert runner.overlapped >= max(lengths) - 2


@pytest.mark.parametrize("pp_build", ["llama"], indirect=True)
def test_a_killed_stage_fails_its_requests_and_the_next_ones_run_on_restarted_stages(pp_build: Any) -> None:
    _, model, result = pp_build
    engine, _, _ = load_engine(Path(result.path), EngineConfig(max_num_seqs=MAX_BATCH))
    try:
        engine.eos_token_ids = frozenset()
        engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=30, temperature=0))
        assert engine.step()[0].error is None  # the prompt and its first token
        group = engine.runner.engine.group
        os.kill(group.workers.procs[0].pid, signal.SIGKILL)  # the first stage: the last one waits on it
        errors = [out.error for _ in range(3) for out in engine.step() if out.error]
        assert errors and "stage 0" in errors[0] and "restarted with an empty KV cache" in errors[0]
        assert not engine.has_unfinished()
        assert not group.workers.procs, "the failed group's surviving stage was stopped"
        engine.add_request("b", PROMPTS[1], SamplingParams(max_tokens=10, temperature=0))
        got: list[int] = []
        while engine.has_unfinished():
            for out in engine.step():
                assert out.error is None
                got += out.token_ids
        assert got == transformers_greedy(model, PROMPTS[1], 10)
    finally:
        engine.runner.engine.close()


def test_more_stages_than_layers_is_refused(tmp_path: Path) -> None:
    model = tiny_causal_lm("llama")
    layers = model.config.num_hidden_layers
    with pytest.raises(OptionsError, match=rf"--pipeline-parallel {layers + 1}: .* has {layers} decoder layers"):
        build_text_generation(model, tmp_path, pipeline_parallel=layers + 1)
    assert not any(tmp_path.rglob("manifest.json"))


@pytest.mark.slow
def test_real_smollm2_at_two_stages_is_token_exact(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct (30 layers, a tied 49152-row head) in two stages generates as transformers does; the
    split balances parameters, so the last stage (with the head) holds fewer layers."""
    from tools.real_model import smollm2_dir

    result = aotforge.build(
        smollm2_dir(), target="onnxruntime", task="text-generation", out=tmp_path, pipeline_parallel=2,
        max_seq_len=256, max_batch=1, bench=False,
    )  # fmt: skip
    assert result.manifest.validation["token_agreement"] == 1.0
    bounds = result.manifest.target.info["pipeline_parallel"]["layout"]["bounds"]
    assert bounds[0] == 0 and bounds[-1] == 30 and bounds[1] > 15
