"""Text generation for tensorrt: --prepare-only bundles, finish, refusals; device runs behind the gpu marker.

Here (no GPU) a bundle is prepared for real: its plan (TensorRT profiles per engine), its graphs run on the CPU
token for token against transformers, and a direct build or ``finish`` refuses with the probe's reason (exit 5).
The ``gpu`` tests build, validate and benchmark on the device host.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.bundle_format import BUNDLE_JSON, read_bundle
from aotforge.compiler.cli import main
from aotforge.compiler.generative.finish import finish_bundle as finish
from aotforge.compiler.isolation import Isolation
from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import (
    EXIT_INTEGRITY,
    EXIT_TARGET_UNAVAILABLE,
    EXIT_USER,
    EXIT_VALIDATION,
    ArtifactError,
    OptionsError,
)
from aotforge.targets import get_target
from tests.conftest import assert_refused
from tests.generative_bundles import compile_cli, device_build, finish_unchanged, kept_out
from tests.llm_models import (
    MAX_SEQ,
    save_tiny_causal_lm,
    tiny_causal_lm,
)
from tests.llm_models import assert_generates_like_transformers as _token_exact


@pytest.fixture(scope="module")
def trt_bundle(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Llama directory prepared for tensorrt through the CLI (one export, ~25 s on 2 busy cores)."""
    result = compile_cli(llama_dir, tmp_path_factory.mktemp("trt"), "tensorrt", "--prepare-only")
    assert result.exit_code == 0, result.output
    return Path(result.stdout.strip().splitlines()[-1])


def test_tensorrt_bundle_plans_both_engines_with_their_profiles(trt_bundle: Path) -> None:
    data = read_bundle(trt_bundle)  # every file's hash checked
    assert data["task"] == "text-generation" and data["target"] == "tensorrt"
    assert {"prefill.onnx", "decode.onnx", "weights.data", "validation.npz"} <= set(data["files"])
    graphs = data["plan"]["graphs"]
    assert {k: (g["onnx"], g["engine"]) for k, g in graphs.items()} == {
        "prefill": ("prefill.onnx", "prefill.engine"),
        "decode": ("decode.onnx", "decode.engine"),
    }
    prefill = {p["input"]: p for p in graphs["prefill"]["plan"]["profiles"]}
    assert set(prefill) == {"input_ids", "attention_mask", "position_ids"}
    # TensorRT-LLM's context ranges: [1, (n + 1) // 2, n] for the batch and the prompt length.
    assert all((p["min"], p["opt"], p["max"]) == ([1, 1], [1, 32], [2, MAX_SEQ]) for p in prefill.values())
    decode = {p["input"]: p for p in graphs["decode"]["plan"]["profiles"]}
    spec = DecoderSpec.from_dict(data["decoder"])
    assert set(decode) == {"input_ids", "position_ids", "write_pos", *spec.kv_names("past")}
    assert (decode["write_pos"]["min"], decode["write_pos"]["max"]) == ([1], [2])
    cache = decode["past_value_1"]  # the static cache: only the batch varies
    assert (cache["min"], cache["max"]) == ([1, 2, MAX_SEQ, 16], [2, 2, MAX_SEQ, 16])
    # TensorRT's parser has no com.microsoft ops: the decode graph is the masked (standard ONNX) export.
    import onnx

    decode_graph = onnx.load(str(trt_bundle / "decode.onnx"), load_external_data=False)
    assert {n.domain for n in decode_graph.graph.node} <= {"", "ai.onnx"}
    assert data["cpu_check"]["token_agreement"] == 1.0 and data["cpu_check"]["max_logits_rel_l2"] < 1e-4


@pytest.mark.slow  # a second export (~25 s on 2 busy cores): GPT-2's learned positions and Conv1D layers
def test_gpt2_tensorrt_bundle_passes_its_cpu_check(tmp_path: Path) -> None:
    result = compile_cli(save_tiny_causal_lm("gpt2", tmp_path / "gpt2"), tmp_path / "out", "tensorrt", "--prepare-only")
    assert result.exit_code == 0, result.output
    data = read_bundle(Path(result.stdout.strip().splitlines()[-1]))
    assert data["cpu_check"]["token_agreement"] == 1.0 and set(data["plan"]["graphs"]) == {"prefill", "decode"}


def test_tensorrt_bundle_graphs_are_token_exact_under_onnxruntime(trt_bundle: Path) -> None:
    """The bundle's own ONNX graphs, batch of two left-padded prompts, against transformers' greedy generate."""
    from aotforge.targets.generative.runner import GenerativeRunner
    from aotforge.targets.onnxruntime import OrtOptions, session_options
    from aotforge.targets.onnxruntime.decoder import OrtStepEngine

    spec = DecoderSpec.from_dict(read_bundle(trt_bundle)["decoder"])
    engine = OrtStepEngine(trt_bundle, spec, session_options(OrtOptions()), ["CPUExecutionProvider"])
    _token_exact(GenerativeRunner(engine), tiny_causal_lm("llama"))


@pytest.mark.parametrize("target", ["tensorrt", "neuron"])
def test_direct_build_refuses_with_the_probe_reason(target: str, llama_dir: Path, tmp_path: Path) -> None:
    probe = get_target(target).probe()
    if probe.available:
        pytest.skip(f"{target} is available here")
    result = compile_cli(llama_dir, tmp_path / "out", target)
    assert result.exit_code == 5, result.output
    assert probe.reason.split(":")[0] in result.output and "not available on this host" in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("manifest.json"))


def test_finish_without_tensorrt_refuses_with_the_probe_reason(trt_bundle: Path, tmp_path: Path) -> None:
    probe = get_target("tensorrt").probe()
    if probe.available:
        pytest.skip("tensorrt is available here")
    result = CliRunner().invoke(main, ["finish", str(trt_bundle), "--out", str(tmp_path)])
    assert result.exit_code == 5, result.output
    assert "lacks" in result.output and not any(tmp_path.rglob("manifest.json"))


def test_tensorrt_bundle_finishes_on_onnxruntime_token_exact(trt_bundle: Path, tmp_path: Path) -> None:
    """The finish tail on this CPU: compile, validate against the references in the bundle, store."""
    result = finish(trt_bundle, tmp_path, target_name="onnxruntime", bench=False)
    v = result.manifest.validation
    assert v["passed"] and v["token_agreement"] == 1.0 and "stored in the bundle" in v["reference"]
    assert result.manifest.build["bundle"]["sha256"]
    _token_exact(aotforge.load(result.path), tiny_causal_lm("llama"))
    with pytest.raises(OptionsError, match="finishes for tensorrt or onnxruntime"):
        finish(trt_bundle, tmp_path, target_name="tvm")


def _stand_in_tensorrt_sdk(monkeypatch: pytest.MonkeyPatch, *, corrupt: bool = False) -> list[tuple[str, Any, bytes]]:
    """The TensorRT SDK stood in: an "engine" is its ONNX file's name, the step engine ONNX Runtime over those
    files (its logits negated with ``corrupt``: validation must fail). Returns the engine builds as they come."""
    from aotforge.targets.base import ProbeResult
    from aotforge.targets.onnxruntime.decoder import OrtStepEngine
    from aotforge.targets.tensorrt import generative, sdk, target
    from aotforge.targets.tensorrt.sdk import EngineBuild

    built: list[tuple[str, Any, bytes]] = []

    def build_engine(onnx_path: Path, plan: Any, cache: bytes) -> EngineBuild:
        built.append((onnx_path.name, tuple(p.input for p in plan.profiles), cache))
        return EngineBuild(str(onnx_path).encode(), cache + b"+" + onnx_path.name.encode(), "", "10.99")

    class Negated(OrtStepEngine):
        def prefill(self, *args: Any) -> Any:
            return -super().prefill(*args)

        def decode(self, *args: Any) -> Any:
            return -super().decode(*args)

    def step_engine(prefill: bytes, decode: bytes, spec: DecoderSpec, *, allow_host_code: bool) -> Any:
        from aotforge.targets.onnxruntime import OrtOptions, session_options

        assert Path(prefill.decode()).name == "prefill.onnx" and Path(decode.decode()).name == "decode.onnx"
        engine = Negated if corrupt else OrtStepEngine
        return engine(Path(prefill.decode()).parent, spec, session_options(OrtOptions()), ["CPUExecutionProvider"])

    gpu = {"name": "stand-in", "compute_capability": "9.0"}
    monkeypatch.setattr(target, "probe_host", lambda: ProbeResult(True))
    monkeypatch.setattr(sdk, "probe_host", lambda: ProbeResult(True))
    monkeypatch.setattr(sdk, "build_engine", build_engine)
    monkeypatch.setattr(sdk, "step_engine", step_engine)
    monkeypatch.setattr(sdk, "version", lambda: "10.99")
    monkeypatch.setattr(generative, "query_gpu", lambda: gpu)
    return built


def test_tensorrt_bundle_finishes_through_a_stand_in_sdk(
    trt_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``finish`` for tensorrt with the SDK stood in: both engines are built from their plans, one timing cache
    threads through both builds, and the artifact validates, records both engines and loads through
    ``aotforge.load``."""
    built = _stand_in_tensorrt_sdk(monkeypatch)
    cache = tmp_path / "timing.cache"
    data = read_bundle(trt_bundle)
    assert data["target_options"]["timing_cache"] == ""
    # In this process: the stand-in SDK is this process's monkeypatch (a worker would import the real one).
    result = finish(trt_bundle, tmp_path / "out", bench=False, isolation=Isolation(enabled=False))
    assert [(b[0], b[2]) for b in built] == [("prefill.onnx", b""), ("decode.onnx", b"+prefill.onnx")]
    assert built[0][1] == ("input_ids", "attention_mask", "position_ids") and "past_key_0" in built[1][1]
    m = result.manifest
    assert m.validation["token_agreement"] == 1.0
    assert {"prefill.engine", "decode.engine", "prefill.onnx", "decode.onnx", "weights.data"} <= set(m.files)
    assert set(m.target.info["engines"]) == {"prefill", "decode"} and m.toolchain["tensorrt"] == "10.99"
    assert not cache.exists()  # no timing_cache option in the bundle: none written
    assert (result.path / "prefill.engine").read_bytes().endswith(b"prefill.onnx")


def test_finish_compiles_in_the_isolated_worker_under_its_deadline(trt_bundle: Path, tmp_path: Path) -> None:
    """``aotforge finish`` takes build's isolation flags: the compile runs in the spawned worker, whose deadline
    stops it, and nothing is stored; ``--run-deadline``, which a text-generation bundle's in-process validation
    would not read, is refused by name."""
    out = kept_out(tmp_path)
    result = finish_unchanged(trt_bundle, out, "--target", "onnxruntime", "--backend-deadline", "0.001")
    assert_refused(result, EXIT_USER, r"did not finish within 0.001 s.*--backend-deadline")
    result = finish_unchanged(trt_bundle, out, "--target", "onnxruntime", "--run-deadline", "5")
    assert_refused(result, EXIT_USER, "--run-deadline does not apply to a text-generation bundle")


def test_a_changed_bundle_is_refused(trt_bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(trt_bundle, copy)
    data = json.loads((copy / BUNDLE_JSON).read_text())
    data["plan"]["graphs"]["decode"]["plan"]["profiles"][0]["max"] = [64, 1]
    (copy / BUNDLE_JSON).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="modified"):
        finish(copy, tmp_path / "out", target_name="onnxruntime")


def test_finish_refusals_leave_the_bundle_and_out_as_they_were(trt_bundle: Path, tmp_path: Path) -> None:
    out = kept_out(tmp_path)
    other = finish_unchanged(trt_bundle, out, "--target", "tvm")
    assert_refused(other, EXIT_USER, "finishes for tensorrt or onnxruntime .*not tvm")
    if not get_target("tensorrt").probe().available:
        assert_refused(finish_unchanged(trt_bundle, out), EXIT_TARGET_UNAVAILABLE, "cannot finish .* lacks")
    changed = tmp_path / "changed"
    shutil.copytree(trt_bundle, changed)
    with (changed / "validation.npz").open("ab") as f:
        f.write(b"\0")
    assert_refused(finish_unchanged(changed, out), EXIT_INTEGRITY, "validation.npz .*changed since the bundle")


def test_a_finish_failing_validation_leaves_nothing(
    trt_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both engines built and staged, then the engines' tokens miss the bundle's references: no artifact."""
    built = _stand_in_tensorrt_sdk(monkeypatch, corrupt=True)
    result = finish_unchanged(trt_bundle, kept_out(tmp_path), "--no-isolate-backend")  # the stand-in is here
    assert_refused(result, EXIT_VALIDATION, "agree")
    assert [b[0] for b in built] == ["prefill.onnx", "decode.onnx"]  # it failed after the compile, not before


def test_prepare_only_for_a_cpu_target_and_speculative_bundles_are_refused(llama_dir: Path, tmp_path: Path) -> None:
    result = compile_cli(llama_dir, tmp_path, "onnxruntime", "--prepare-only")
    assert result.exit_code == 2 and "tensorrt and neuron" in result.output
    result = compile_cli(llama_dir, tmp_path, "tensorrt", "--prepare-only", "--speculative-k", "3")
    assert result.exit_code == 2 and "no verify graph" in result.output


@pytest.mark.gpu
def test_tensorrt_text_generation_end_to_end(llama_dir: Path, tmp_path: Path) -> None:
    device_build("tensorrt", llama_dir, tmp_path)
    from aotforge.artifacts.loader import load

    artifact = next(tmp_path.rglob("manifest.json")).parent
    engine = load(artifact)._generative().engine
    engine.start(1, 4)
    before = engine.cache_pointers()
    engine.prefill(np.array([[1, 2, 3, 4]]), np.ones((1, 4), dtype=np.int64), np.arange(4)[None, :])
    for step in range(3):
        engine.decode(np.array([[5]]), np.array([4 + step]))
    assert engine.cache_pointers() == before  # both caches allocated once per call, never per token


@pytest.mark.gpu
def test_tensorrt_bundle_finishes_on_the_gpu_host(trt_bundle: Path, tmp_path: Path) -> None:
    if not get_target("tensorrt").probe().available:
        pytest.skip(get_target("tensorrt").probe().reason)
    result = finish(trt_bundle, tmp_path, bench=False)
    assert result.manifest.validation["token_agreement"] == 1.0
    assert {"prefill.engine", "decode.engine"} <= set(result.manifest.files)
