"""Pipeline-parallel builds at low precision (``--pipeline-parallel 2 --precision int4``) on the tiny Llama.

A stage holds whole layers, so each of its weights is quantized as the unsharded build quantizes it: the two int4
stages must generate exactly what the unsharded int4 artifact generates (greedy), not merely what the fp32 model
does. The build is quality-gated as any int4 build is, and what a stage graph cannot honour is refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import aotforge
from aotforge.artifacts.engine_loader import load_engine
from aotforge.core.errors import OptionsError
from aotforge.runtime.params import EngineConfig, SamplingParams
from tests.llm_models import MAX_BATCH, PROMPTS, build_text_generation

DEGREE = 2
#: round to nearest: no calibration, so the test builds quickly and both builds quantize the same weights alike
RTN = ["weight-only.method=rtn"]
#: a random model's perplexity moves either way under int4: the gate's figures are recorded, not the point here
GENEROUS = 10.0


@pytest.fixture(scope="module")
def int4_builds(
    llama_dir: Path, llama_ort: Any, llama_pp: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, Any]:
    """``(unsharded int4, pipeline-parallel 2 int4)`` of the tiny Llama, same passes. Round to nearest leaves the
    weights as they are, so both export what the fp32 ``llama_ort`` and ``llama_pp`` did: asked for first, they
    leave those graphs in the run's export cache (the passes run after it)."""
    out = tmp_path_factory.mktemp("pp-int4")
    kw: dict[str, Any] = {"precision": "int4", "pass_opt": RTN, "max_perplexity_increase": GENEROUS, "plots": False}
    whole = build_text_generation(llama_dir, out / "whole", **kw)
    staged = build_text_generation(llama_dir, out / "pp", pipeline_parallel=DEGREE, **kw)
    return whole, staged


def test_int4_stages_generate_exactly_what_the_unsharded_int4_artifact_generates(int4_builds: Any) -> None:
    whole_result, staged_result = int4_builds
    whole, staged = aotforge.load(whole_result.path), aotforge.load(staged_result.path)
    try:
        for prompt in PROMPTS:
            ids = np.array([prompt])
            want = whole.generate(ids, 12, ignore_eos=True)
            assert staged.generate(ids, 12, ignore_eos=True).tolist() == want.tolist()
    finally:
        staged._generative().engine.close()


def _serve(artifact: Path, prompts: list[list[int]], lengths: list[int]) -> tuple[dict[str, list[int]], Any]:
    engine, _, _ = load_engine(artifact, EngineConfig(max_num_seqs=MAX_BATCH, max_num_batched_tokens=16))
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
            got[out.request_id] += out.token_ids
    return got, engine


def test_int4_stages_serve_batches_in_flight_like_the_unsharded_int4_artifact(int4_builds: Any) -> None:
    """The serving engine keeps a batch in flight a stage; the last stage hands each decode's logits back through
    the group's shared segment, not its pipe."""
    whole, staged = int4_builds
    prompts, lengths = [PROMPTS[0], PROMPTS[1], [9, 8, 7], [40, 41], [3] * 11], [9, 4, 12, 6, 3]
    want, _ = _serve(Path(whole.path), prompts, lengths)
    got, engine = _serve(Path(staged.path), prompts, lengths)
    try:
        assert engine.batches_in_flight == DEGREE and engine.runner.peak_in_flight == DEGREE
        assert engine.runner.engine.group.logits is not None
        assert got == want
    finally:
        engine.runner.engine.close()


def test_each_int4_stage_holds_4_bit_matmuls_and_the_build_is_quality_gated(int4_builds: Any) -> None:
    _, result = int4_builds
    manifest, path = result.manifest, Path(result.path)
    validation = manifest.validation
    assert validation["passed"] and validation["gated"] is False and validation["quality"]["perplexity"] > 1
    stages = manifest.target.info["pipeline_parallel"]["stages"]
    packed = [p for p in manifest.passes if p["name"] == "weight-only"]
    assert {p["graph"].rsplit("/", 1)[0] for p in packed} == set(stages)  # every stage's graphs went through it
    for stage in stages:
        graph = onnx.load(str(path / stage / "decode.onnx"), load_external_data=False).graph
        assert any(node.op_type == "MatMulNBits" for node in graph.node)
        assert not any(node.op_type == "MatMul" and node.input[1] in {i.name for i in graph.initializer}
                       for node in graph.node)  # fmt: skip


def test_per_layer_bits_are_refused_for_stages(llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="--pipeline-parallel: weight-only layers_8bit"):
        build_text_generation(
            llama_dir,
            tmp_path / "out",
            pipeline_parallel=DEGREE,
            precision="int4",
            pass_opt=[*RTN, "weight-only.layers_8bit=0"],
        )
    assert not any(p.is_file() for p in (tmp_path / "out").rglob("*"))
