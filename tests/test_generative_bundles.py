"""Text generation for tensorrt and neuron: --prepare-only bundles, finish, refusals; device runs behind markers.

Here (no GPU, no Neuron SDK) a bundle is prepared for real: its plan (TensorRT profiles per engine / NxD
Inference's context-encoding and token-generation buckets), its graphs run on the CPU token for token against
transformers, and a direct build or ``finish`` refuses with the probe's reason (exit 5). The ``gpu`` and
``neuron`` tests build, validate and benchmark on the device host.
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
from aotforge.compiler.bundle import BUNDLE_JSON, read_bundle
from aotforge.compiler.cli import main
from aotforge.compiler.generative.bundle_finish import finish_bundle as finish
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
from aotforge.targets.neuron.generative import generate_buckets, plan_buckets
from aotforge.targets.neuron.target import NeuronOptions
from aotforge.targets.tensorrt.generative import engine_plans
from aotforge.targets.tensorrt.target import TensorRTOptions
from tests.conftest import assert_refused, tree_state
from tests.llm_models import (
    MAX_SEQ,
    NEW,
    PROMPTS,
    save_tiny_causal_lm,
    tiny_causal_lm,
    transformers_greedy,
)
from tests.llm_models import assert_generates_like_transformers as _token_exact


def _compile(model_dir: Path, out: Path, target: str, *extra: str) -> Any:
    args = ["compile", str(model_dir), "--task", "text-generation", "-t", target, "--max-seq-len", str(MAX_SEQ)]
    return CliRunner().invoke(main, [*args, "--max-batch", "2", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def trt_bundle(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Llama directory prepared for tensorrt through the CLI (one export, ~25 s on 2 busy cores)."""
    result = _compile(llama_dir, tmp_path_factory.mktemp("trt"), "tensorrt", "--prepare-only")
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
    result = _compile(save_tiny_causal_lm("gpt2", tmp_path / "gpt2"), tmp_path / "out", "tensorrt", "--prepare-only")
    assert result.exit_code == 0, result.output
    data = read_bundle(Path(result.stdout.strip().splitlines()[-1]))
    assert data["cpu_check"]["token_agreement"] == 1.0 and set(data["plan"]["graphs"]) == {"prefill", "decode"}


def test_tensorrt_bundle_graphs_are_token_exact_under_onnxruntime(trt_bundle: Path) -> None:
    """The bundle's own ONNX graphs, batch of two left-padded prompts, against transformers' greedy generate."""
    from aotforge.targets.generative.ort_engine import OrtStepEngine
    from aotforge.targets.generative.runner import GenerativeRunner
    from aotforge.targets.onnxruntime import OrtOptions, session_options

    spec = DecoderSpec.from_dict(read_bundle(trt_bundle)["decoder"])
    engine = OrtStepEngine(trt_bundle, spec, session_options(OrtOptions()), ["CPUExecutionProvider"])
    _token_exact(GenerativeRunner(engine), tiny_causal_lm("llama"))


@pytest.mark.parametrize("target", ["tensorrt", "neuron"])
def test_direct_build_refuses_with_the_probe_reason(target: str, llama_dir: Path, tmp_path: Path) -> None:
    probe = get_target(target).probe()
    if probe.available:
        pytest.skip(f"{target} is available here")
    result = _compile(llama_dir, tmp_path / "out", target)
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
    from aotforge.targets.generative.ort_engine import OrtStepEngine
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
    result = finish(trt_bundle, tmp_path / "out", bench=False)
    assert [(b[0], b[2]) for b in built] == [("prefill.onnx", b""), ("decode.onnx", b"+prefill.onnx")]
    assert built[0][1] == ("input_ids", "attention_mask", "position_ids") and "past_key_0" in built[1][1]
    m = result.manifest
    assert m.validation["passed"] and m.validation["token_agreement"] == 1.0
    assert {"prefill.engine", "decode.engine", "prefill.onnx", "decode.onnx", "weights.data"} <= set(m.files)
    assert set(m.target.info["engines"]) == {"prefill", "decode"} and m.toolchain["tensorrt"] == "10.99"
    assert not cache.exists()  # no timing_cache option in the bundle: none written
    assert (result.path / "prefill.engine").read_bytes().endswith(b"prefill.onnx")


def test_a_changed_bundle_is_refused(trt_bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(trt_bundle, copy)
    data = json.loads((copy / BUNDLE_JSON).read_text())
    data["plan"]["graphs"]["decode"]["plan"]["profiles"][0]["max"] = [64, 1]
    (copy / BUNDLE_JSON).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="modified"):
        finish(copy, tmp_path / "out", target_name="onnxruntime")


def _kept_out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("an earlier build's")
    return out


def _finish_unchanged(bundle: Path, out: Path, *extra: str) -> Any:
    """``aotforge finish``; the bundle and --out must be as they were afterwards (listing and bytes)."""
    before = (tree_state(bundle), tree_state(out))
    result = CliRunner().invoke(main, ["finish", str(bundle), "--out", str(out), "--no-bench", *extra])
    assert (tree_state(bundle), tree_state(out)) == before, result.output
    return result


def test_finish_refusals_leave_the_bundle_and_out_as_they_were(trt_bundle: Path, tmp_path: Path) -> None:
    out = _kept_out(tmp_path)
    other = _finish_unchanged(trt_bundle, out, "--target", "tvm")
    assert_refused(other, EXIT_USER, "finishes for tensorrt or onnxruntime .*not tvm")
    if not get_target("tensorrt").probe().available:
        assert_refused(_finish_unchanged(trt_bundle, out), EXIT_TARGET_UNAVAILABLE, "cannot finish .* lacks")
    changed = tmp_path / "changed"
    shutil.copytree(trt_bundle, changed)
    with (changed / "validation.npz").open("ab") as f:
        f.write(b"\0")
    assert_refused(_finish_unchanged(changed, out), EXIT_INTEGRITY, "validation.npz .*changed since the bundle")


def test_a_finish_failing_validation_leaves_nothing(
    trt_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both engines built and staged, then the engines' tokens miss the bundle's references: no artifact."""
    built = _stand_in_tensorrt_sdk(monkeypatch, corrupt=True)
    result = _finish_unchanged(trt_bundle, _kept_out(tmp_path))
    assert_refused(result, EXIT_VALIDATION, "agree")
    assert [b[0] for b in built] == ["prefill.onnx", "decode.onnx"]  # it failed after the compile, not before


NEURON_BUCKETS = "buckets=prompt=8/16/64,cache=16/32/64"


def _neuron_bundle(arch: str, root: Path) -> Path:
    model_dir = save_tiny_causal_lm(arch, root / arch)
    result = _compile(model_dir, root / "out", "neuron", "--prepare-only", "--target-opt", NEURON_BUCKETS)
    assert result.exit_code == 0, result.output
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpt2_neuron_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _neuron_bundle("gpt2", tmp_path_factory.mktemp("neuron"))


#: The CPU check decodes 3 prompts x 24 tokens through the torch modules (~10 s quiet, ~40 s on 2 loaded cores).
@pytest.mark.parametrize("arch", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_neuron_bundle_lays_out_nxdi_buckets_and_runs_them_on_cpu(
    arch: str, gpt2_neuron_bundle: Path, tmp_path: Path
) -> None:
    """Context-encoding and token-generation buckets; the CPU check pads and routes as the Neuron runtime does."""
    bundle = gpt2_neuron_bundle if arch == "gpt2" else _neuron_bundle(arch, tmp_path)
    data = read_bundle(bundle)
    plan = data["plan"]
    assert plan["buckets"] == {"batch": [2], "prompt": [8, 16, 64], "cache": [16, 32, 64]}
    kinds = [(g["kind"], g["batch"], g["length"]) for g in plan["graphs"]]
    assert kinds == [("context_encoding", 2, n) for n in (8, 16, 64)] + [
        ("token_generation", 2, n) for n in (16, 32, 64)
    ]
    assert plan["compiler_args"][-2:] == ["--auto-cast", "none"]
    assert {"model/config.json", "model/model.safetensors", "validation.npz"} <= set(data["files"])
    assert not any(f.endswith(".onnx") for f in data["files"])  # neuronx-cc traces torch, not ONNX
    check = data["cpu_check"]
    assert check["token_agreement"] == 1.0 and check["max_logits_rel_l2"] < 1e-4
    # Prompts of 5, 11 and 17 tokens and 24 new ones: several buckets of each kind ran.
    assert {"context_encoding.b2-8", "context_encoding.b2-16", "context_encoding.b2-64"} <= set(check["graphs_run"])
    assert {"token_generation.b2-16", "token_generation.b2-32", "token_generation.b2-64"} <= set(check["graphs_run"])
    if not get_target("neuron").probe().available:
        done = CliRunner().invoke(main, ["finish", str(bundle), "-o", str(tmp_path)])
        assert done.exit_code == 5, done.output


def _stand_in_neuron_sdk(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """torch-neuronx's calls stood in by torch on CPU; returns the "traced" modules by file name."""
    import torch

    from aotforge.targets.base import ProbeResult
    from aotforge.targets.neuron import sdk

    traced: dict[str, Any] = {}

    def trace_to_file(module: Any, examples: list[np.ndarray], args: list[str], workdir: Path, out: Path) -> None:
        with torch.inference_mode():
            module(*(torch.from_numpy(a) for a in examples))  # what torch_neuronx.trace runs first
        assert args[:2] == ["--target", "inf2"]
        out.write_bytes(b"stand-in for a traced Neuron graph")
        traced[out.name] = module

    monkeypatch.setattr(sdk, "probe", lambda python="": ProbeResult(True))
    monkeypatch.setattr(sdk, "trace_to_file", trace_to_file)
    monkeypatch.setattr(sdk, "versions", lambda: {"torch-neuronx": "stand-in"})
    monkeypatch.setattr(sdk, "host_instance_type", lambda: "inf2.xlarge")
    monkeypatch.setattr(sdk, "load_traced", lambda path: traced[Path(path).name])
    return traced


def test_neuron_bundle_finishes_through_a_stand_in_sdk(
    gpt2_neuron_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``finish`` for neuron with the four torch-neuronx calls stood in by torch on CPU: every bucket is
    traced with its example inputs, the artifact holds one file per bucket, validates token for token
    against the references in the bundle, and loads and generates through ``aotforge.load``."""
    traced = _stand_in_neuron_sdk(monkeypatch)
    done = CliRunner().invoke(main, ["finish", str(gpt2_neuron_bundle), "--out", str(tmp_path), "--no-bench"])
    assert done.exit_code == 0, done.output
    assert "greedy token agreement 100.0%" in done.stderr
    loaded = aotforge.load(done.stdout.strip().splitlines()[-1])
    m = loaded.manifest
    assert m.validation["passed"] and m.validation["token_agreement"] == 1.0 and m.benchmark is None
    files = {g["file"] for g in m.target.info["graphs"]}
    assert len(files) == 6 and files <= set(m.files) and files == set(traced)
    assert not any(f.startswith("model/") for f in m.files)  # the source weights stay in the bundle
    _token_exact(loaded, tiny_causal_lm("gpt2"))


def test_a_neuron_finish_failing_a_bucket_leaves_nothing(
    gpt2_neuron_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """neuronx-cc (stood in) fails on the third bucket, two traced graphs already staged: no artifact."""
    from aotforge.core.errors import CompileError
    from aotforge.targets.neuron import sdk

    traced = _stand_in_neuron_sdk(monkeypatch)
    trace = sdk.trace_to_file

    def fails_third(module: Any, examples: list[np.ndarray], args: list[str], workdir: Path, out: Path) -> None:
        if len(traced) == 2:
            raise CompileError(f"neuronx-cc failed for shapes {[a.shape for a in examples]} (stand-in)")
        trace(module, examples, args, workdir, out)

    monkeypatch.setattr(sdk, "trace_to_file", fails_third)
    result = _finish_unchanged(gpt2_neuron_bundle, _kept_out(tmp_path))
    assert_refused(result, EXIT_USER, "neuronx-cc failed for shapes")
    assert len(traced) == 2


def test_neuron_bucket_engine_is_token_exact_against_transformers() -> None:
    """The bucket routing over the torch modules the device host traces, batch of two left-padded prompts."""
    from aotforge.compiler.generative.export import decoder_spec
    from aotforge.compiler.generative.torch_inputs import torch_bucket_engine
    from aotforge.targets.generative.runner import GenerativeRunner

    model = tiny_causal_lm("gpt2")
    spec = decoder_spec(model, MAX_SEQ, 2)
    plan = {
        "graphs": [
            {"kind": k, "batch": 2, "length": n}
            for k, n in [
                ("context_encoding", 8),
                ("context_encoding", 64),
                ("token_generation", 16),
                ("token_generation", 64),
            ]
        ]
    }
    engine = torch_bucket_engine(model, spec, plan)
    _token_exact(GenerativeRunner(engine), model)
    assert ("token_generation", 2, 16) in engine.calls and ("token_generation", 2, 64) in engine.calls


def test_bucket_and_profile_plans() -> None:
    # NxD Inference's own test values for autobucketing.generate_buckets.
    assert generate_buckets(128, 128) == [128]
    assert generate_buckets(128, 512) == [128, 256, 512]
    assert generate_buckets(64, 256) == [64, 128, 256]
    assert generate_buckets(128, 513) == [128, 256, 513]
    spec = DecoderSpec(layers=2, kv_heads=2, head_dim=16, vocab=500, max_seq_len=2048, max_batch=4)
    buckets = plan_buckets(spec, NeuronOptions())
    assert buckets.prompt == buckets.cache == (128, 256, 512, 1024, 2048) and buckets.batch == (4,)
    with pytest.raises(OptionsError, match="must end at 2048"):
        plan_buckets(spec, NeuronOptions(buckets=("prompt=128/1024",)))
    with pytest.raises(OptionsError, match="dim=size"):
        plan_buckets(spec, NeuronOptions(buckets=("seq=128/2048",)))
    with pytest.raises(OptionsError, match="max_buckets"):
        plan_buckets(spec, NeuronOptions(buckets=("batch=1/2/3/4",)))
    plans = engine_plans(spec, TensorRTOptions())
    ids = next(p for p in plans["prefill"].profiles if p.input == "input_ids")
    assert (ids.min, ids.opt, ids.max) == ((1, 1), (2, 1024), (4, 2048))
    cache = next(p for p in plans["decode"].profiles if p.input == "past_key_0")
    assert (cache.min, cache.opt, cache.max) == ((1, 2, 2048, 16), (2, 2, 2048, 16), (4, 2, 2048, 16))


def test_prepare_only_for_a_cpu_target_and_speculative_bundles_are_refused(llama_dir: Path, tmp_path: Path) -> None:
    result = _compile(llama_dir, tmp_path, "onnxruntime", "--prepare-only")
    assert result.exit_code == 2 and "tensorrt and neuron" in result.output
    result = _compile(llama_dir, tmp_path, "tensorrt", "--prepare-only", "--speculative-k", "3")
    assert result.exit_code == 2 and "no verify graph" in result.output


def _device_build(target: str, llama_dir: Path, out: Path) -> None:
    probe = get_target(target).probe()
    if not probe.available:
        pytest.skip(probe.reason)
    result = aotforge.build(
        str(llama_dir), target=target, task="text-generation", out=out, max_seq_len=MAX_SEQ, max_batch=2, bench=True
    )
    m = result.manifest
    assert m.validation["passed"] and m.validation["token_agreement"] == 1.0
    generation = m.benchmark["generation"]
    assert generation["itl_ms"]["p50"] > 0 and generation["tokens_per_s"]["2"] > 0
    loaded = aotforge.load(result.path)
    _token_exact(loaded, tiny_causal_lm("llama"))
    streamed = np.stack(list(loaded.stream(np.array([PROMPTS[0]]), NEW)), axis=1)
    assert streamed[0].tolist() == transformers_greedy(tiny_causal_lm("llama"), PROMPTS[0], NEW)


@pytest.mark.gpu
def test_tensorrt_text_generation_end_to_end(llama_dir: Path, tmp_path: Path) -> None:
    _device_build("tensorrt", llama_dir, tmp_path)
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
    assert result.manifest.validation["passed"] and result.manifest.validation["token_agreement"] == 1.0
    assert {"prefill.engine", "decode.engine"} <= set(result.manifest.files)


@pytest.mark.neuron
def test_neuron_text_generation_end_to_end(llama_dir: Path, tmp_path: Path) -> None:
    _device_build("neuron", llama_dir, tmp_path)


def test_direct_neuron_build_prepares_and_finishes_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a host whose probe passes (stood in), a direct build is the bundle's two halves: no bundle is left."""
    traced = _stand_in_neuron_sdk(monkeypatch)
    model_dir = save_tiny_causal_lm("gpt2", tmp_path / "gpt2")
    result = aotforge.build(
        str(model_dir),
        target="neuron",
        task="text-generation",
        out=tmp_path / "out",
        max_seq_len=16,
        max_batch=1,
        bench=False,
        plots=False,
    )
    m = result.manifest
    assert m.validation["passed"] and m.validation["token_agreement"] == 1.0
    assert sorted(traced) == ["context_encoding.b1-p16.neuron.pt", "token_generation.b1-c16.neuron.pt"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpt2"]  # no bundle or temp dir left
