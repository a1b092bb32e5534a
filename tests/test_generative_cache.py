"""Text-generation builds go through the one build tail: the build cache, --dump-ir and refusals by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.core.errors import OptionsError
from tests.conftest import CPU_TARGETS
from tests.llm_models import PROMPTS, TVM_BUCKETS, build_text_generation

NEW_TOKENS = 8


def _tokens(path: Path) -> np.ndarray:
    ids = np.asarray([PROMPTS[0]], dtype=np.int64)
    return np.asarray(aotforge.load(path).generate(ids, NEW_TOKENS, ignore_eos=True))


def _target(result: Any) -> Any:
    """The manifest's target record as its JSON says it (a record read back holds lists where a new one has tuples)."""
    return json.loads(json.dumps(result.manifest.to_dict()["target"]))


def _artifact_files(result: Any) -> dict[str, str]:
    return {k: v for k, v in result.manifest.files.items() if not k.startswith("MODEL_CARD")}


#: tvm's compile removes the exported weights.data (its packed weights replace it): a hit must too. Slow (three
#: exports and tvm's validation builds); onnxruntime keeps the default run's share small.
@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.slow) if t == "tvm" else t for t in CPU_TARGETS])
def test_rebuild_is_a_cache_hit_that_generates_the_same_tokens(target: str, llama_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    kw: dict[str, Any] = {"cache_dir": cache, "plots": False}
    if target == "tvm":
        kw["target_options"] = TVM_BUCKETS
    first = build_text_generation(str(llama_dir), tmp_path / "out", target=target, **kw)
    assert first.manifest.build["cache"]["hit"] is False
    # The IR-level key: the export (read back from the run's export cache) and the passes run again, the compile
    # is served from the cache; --dump-ir turns the direct mode off and writes each graph as the target compiles it.
    dumped = build_text_generation(
        str(llama_dir), tmp_path / "out", target=target, dump_ir=tmp_path / "ir", direct_lookup=False, **kw
    )
    assert dumped.manifest.build["cache"] == {"hit": True, "key": first.manifest.build["cache"]["key"]}
    assert (tmp_path / "ir" / "prefill" / "compiled.onnx").is_file()
    assert (tmp_path / "ir" / "decode" / "compiled.onnx").is_file()
    # Nothing changed: the direct mode serves the whole artifact without loading the model.
    second = build_text_generation(str(llama_dir), tmp_path / "out", target=target, **kw)
    assert second.manifest.build["cache"]["hit"] is True
    assert second.manifest.build["cache"]["direct"] is True
    for hit in (dumped, second):  # the model card names the build (its cache record): every other file is equal
        assert _artifact_files(hit) == _artifact_files(first)
        assert _target(hit) == _target(first)
    want = _tokens(first.path)
    assert len(set(want[0, len(PROMPTS[0]) :].tolist())) > 1
    for hit in (dumped, second):
        np.testing.assert_array_equal(_tokens(hit.path), want)


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"dynamic": ["batch=1:4"]}, "--dynamic"),
        ({"sample_inputs": "inputs.npz"}, "--sample-inputs"),
        ({"calibration": "calib/"}, "--calibration"),
        ({"bench_seconds": 2.0}, "--bench-seconds"),
        ({"run_deadline_s": 5.0}, "--run-deadline"),
    ],
)
def test_options_of_graph_builds_are_refused_by_name(options: dict[str, Any], flag: str, llama_dir: Path) -> None:
    with pytest.raises(OptionsError, match=f"{flag} do.* not apply to text-generation builds"):
        aotforge.build(str(llama_dir), task="text-generation", target="onnxruntime", **options)


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"max_seq_len": 128}, "--max-seq-len"),
        ({"max_batch": 8}, "--max-batch"),
        ({"tensor_parallel": 2}, "--tensor-parallel"),
        ({"pipeline_parallel": 2}, "--pipeline-parallel"),
    ],
)
def test_text_generation_options_are_refused_for_graph_builds(options: dict[str, Any], flag: str) -> None:
    with pytest.raises(OptionsError, match=f"{flag} appl.* to text-generation builds only"):
        aotforge.build("model.onnx", target="onnxruntime", **options)
