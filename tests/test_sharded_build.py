"""Sharded text-generation builds (``--tensor-parallel``, ``--pipeline-parallel``) go through the one build tail like
every build: the build cache (a rebuild with nothing changed is a direct hit), the export cache (each shard's graphs
keyed on the source model and the shard), ``--dump-ir``, the isolated compile and its deadline; what they cannot do
is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.core.errors import CompileError, OptionsError
from tests.llm_models import PROMPTS, SPECULATIVE_K, build_text_generation, tiny_causal_lm, transformers_greedy

DEGREE = 2
#: Each kind's option and the folder its shards' graphs are in.
KINDS = {"tensor_parallel": "ranks", "pipeline_parallel": "stages"}


def _artifact_files(result: Any) -> dict[str, str]:
    return {k: v for k, v in result.manifest.files.items() if not k.startswith("MODEL_CARD")}


#: Both kinds build through ``sharded_build``; the default run builds the ranks, the slow one the stages too.
BOTH = ["tensor_parallel", pytest.param("pipeline_parallel", marks=pytest.mark.slow)]
#: ``llama_tp``'s export settings (tests/conftest.py): the tensor-parallel builds here read its ranks' graphs from
#: the run's export cache instead of exporting them again.
SHARED = {"speculative_k": SPECULATIVE_K}


def _llama_tp_built(kind: str, request: pytest.FixtureRequest) -> bool:
    """Whether the run's export cache holds this kind's shards of the tiny Llama (``llama_tp``, built if not yet)."""
    if kind != "tensor_parallel":
        return False
    request.getfixturevalue("llama_tp")
    return True


@pytest.mark.parametrize("kind", BOTH)
def test_rebuild_with_nothing_changed_is_a_direct_cache_hit(
    kind: str, llama_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _llama_tp_built(kind, request)
    kw: dict[str, Any] = {kind: DEGREE, "cache_dir": tmp_path / "cache", "plots": False, **SHARED}
    first = build_text_generation(str(llama_dir), tmp_path / "out", **kw)
    cache = first.manifest.build["cache"]
    assert cache["hit"] is False and "direct entry stored" in cache["direct"]
    # Nothing changed: the direct mode serves the whole artifact without loading the model.
    second = build_text_generation(str(llama_dir), tmp_path / "out", **kw)
    assert second.manifest.build["cache"]["hit"] is True and second.manifest.build["cache"]["direct"] is True
    assert _artifact_files(second) == _artifact_files(first)  # the model card names the build: every other file
    assert any(f.startswith(f"{KINDS[kind]}/{DEGREE - 1}/") for f in second.manifest.files)
    runner = aotforge.load(second.path)
    try:
        out = runner.generate(np.asarray([PROMPTS[0]], dtype=np.int64), 6, ignore_eos=True)
    finally:
        runner._generative().engine.close()
    assert out[0, len(PROMPTS[0]) :].tolist() == transformers_greedy(tiny_causal_lm("llama"), PROMPTS[0], 6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_rebuild_without_the_direct_mode_is_a_compile_cache_hit(kind: str, llama_dir: Path, tmp_path: Path) -> None:
    """The IR-level key: the export runs again (``--dump-ir`` turns the direct mode off), the compile is served."""
    kw: dict[str, Any] = {kind: DEGREE, "cache_dir": tmp_path / "cache", "plots": False, "bench": False}
    first = build_text_generation(str(llama_dir), tmp_path / "out", **kw)
    dumped = build_text_generation(str(llama_dir), tmp_path / "out", dump_ir=tmp_path / "ir", **kw)
    assert dumped.manifest.build["cache"] == {"hit": True, "key": first.manifest.build["cache"]["key"]}
    assert _artifact_files(dumped) == _artifact_files(first)


@pytest.mark.parametrize("kind", BOTH)
def test_dump_ir_writes_each_shards_graphs_and_the_compile_runs_under_the_deadline(
    kind: str, llama_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``--dump-ir`` writes each rank's or stage's graphs as the target compiles them; the compile then runs in the
    isolated worker, whose deadline stops it: nothing is stored. Where the run built the same shards
    (``llama_tp``), each one's graphs come from the export cache, not a second export."""
    cached = _llama_tp_built(kind, request)
    said: list[str] = []
    with pytest.raises(CompileError, match=r"onnxruntime compile did not finish within 0.001 s.*--backend-deadline"):
        build_text_generation(
            str(llama_dir),
            tmp_path / "out",
            dump_ir=tmp_path / "ir",
            isolate_backend=True,  # the tests' helper builds in this process (tests/in_process.py)
            backend_deadline_s=0.001,
            progress=said.append,
            **{kind: DEGREE, **SHARED},
        )
    for shard in range(DEGREE):
        for graph in ("prefill", "decode", "verify"):
            assert (tmp_path / "ir" / KINDS[kind] / str(shard) / graph / "compiled.onnx").is_file()
        if cached:
            assert any(f"skipping the export of {kind} shard {shard} " in line for line in said), said
    if cached:
        assert not any(line.startswith("exporting ") for line in said), said
    assert not list((tmp_path / "out").rglob("manifest.json"))


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        # tensorrt builds ranks on a GPU host (tests/test_tensorrt_ranks.py), not stages
        ({"target": "tvm"}, "tvm has no .* runtime yet \\(only onnxruntime(, tensorrt)?\\)"),
        # tensor parallelism: fp32 only; pipeline parallelism takes int4 but not per-layer bits (whole-decoder ids)
        ({"precision": "int4", "pass_opt": ["weight-only.layers_8bit=0"]}, "(fp32 for now|layers_8bit)"),
        ({"prepare_only": True}, "builds are bundled \\(--prepare-only\\) for device targets only"),
    ],
)
def test_what_a_sharded_build_cannot_do_is_refused_by_name(
    kind: str, options: dict[str, Any], refusal: str, llama_dir: Path, tmp_path: Path
) -> None:
    flag = "--" + kind.replace("_", "-")
    with pytest.raises(OptionsError, match=f"{flag}.*{refusal}"):
        build_text_generation(str(llama_dir), tmp_path / "out", **{kind: DEGREE, **options})
