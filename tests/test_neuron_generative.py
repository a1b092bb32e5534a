"""Text generation for neuron: --prepare-only bundles with NxD Inference's buckets, finish through stand-in
torch-neuronx calls, refusals; the device run behind the neuron marker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import aotforge
from aotforge.compiler.bundle import read_bundle
from aotforge.compiler.cli import main
from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import (
    EXIT_USER,
    OptionsError,
)
from aotforge.targets import get_target
from aotforge.targets.neuron.generative import generate_buckets, plan_buckets
from aotforge.targets.neuron.target import NeuronOptions
from aotforge.targets.tensorrt.generative import engine_plans
from aotforge.targets.tensorrt.target import TensorRTOptions
from tests.conftest import assert_refused
from tests.generative_bundles import compile_cli, device_build, finish_unchanged, kept_out
from tests.llm_models import (
    MAX_SEQ,
    save_tiny_causal_lm,
    tiny_causal_lm,
)
from tests.llm_models import assert_generates_like_transformers as _token_exact

NEURON_BUCKETS = "buckets=prompt=8/16/64,cache=16/32/64"


def _neuron_bundle(arch: str, root: Path) -> Path:
    model_dir = save_tiny_causal_lm(arch, root / arch)
    result = compile_cli(model_dir, root / "out", "neuron", "--prepare-only", "--target-opt", NEURON_BUCKETS)
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
    assert m.validation["token_agreement"] == 1.0 and m.benchmark is None
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
    result = finish_unchanged(gpt2_neuron_bundle, kept_out(tmp_path))
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


@pytest.mark.neuron
def test_neuron_text_generation_end_to_end(llama_dir: Path, tmp_path: Path) -> None:
    device_build("neuron", llama_dir, tmp_path)


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
    assert m.validation["token_agreement"] == 1.0
    assert sorted(traced) == ["context_encoding.b1-p16.neuron.pt", "token_generation.b1-c16.neuron.pt"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpt2"]  # no bundle or temp dir left
