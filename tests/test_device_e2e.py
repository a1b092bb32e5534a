"""End to end on the real devices: build, validate and benchmark a small CNN and a small transformer.

Marked ``gpu`` (TensorRT on an NVIDIA GPU) or ``neuron`` (Inferentia/Trainium); deselected by
default. Selected on a host without the SDK or device, each test skips with the target's own
probe reason, so the skip line says exactly what is missing. ``make device-check`` runs the GPU
ones in one go.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aotforge.artifacts.hashing import require_intact
from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.bundle import finish
from aotforge.core.spec import DimRange
from aotforge.targets import get_target
from tests.conftest import EXAMPLES, quick_build

MODELS = {
    "mini_resnet": ("mini_resnet.py", (DimRange("batch", 1, 2, 8),)),
    "tiny_transformer": ("tiny_transformer.py", (DimRange("batch", 1, 1, 8), DimRange("seq", 1, 16, 64))),
}


def _require(target: str) -> None:
    probe = get_target(target).probe()
    if not probe.available:
        pytest.skip(probe.reason)


def _check(result_path: Path, tolerance: float) -> None:
    manifest = read_manifest(result_path)
    require_intact(result_path, manifest)
    assert all(m["rel_l2"] <= tolerance for m in manifest.validation["metrics"].values())
    assert manifest.benchmark is not None and manifest.benchmark["p50_ms"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("passes", [("O1",), ("O1", "fp16")], ids=["fp32", "fp16"])
@pytest.mark.parametrize("model", list(MODELS))
def test_tensorrt_builds_validates_and_benchmarks(model: str, passes: tuple[str, ...], tmp_path: Path) -> None:
    _require("tensorrt")
    file, dims = MODELS[model]
    tolerance = 1e-2 if "fp16" in passes else 1e-3  # TF32 tactics are allowed for fp32 layers
    result = quick_build(
        str(EXAMPLES / file),
        tmp_path,
        target="tensorrt",
        passes=passes,
        dynamic=dims,
        tolerance=tolerance,
        bench=True,
        cache_dir=tmp_path / "cache",
        target_options={"timing_cache": str(tmp_path / "cache" / "timing.bin")},
    )
    _check(result.path, tolerance)
    info = result.manifest.target.info
    assert info["tensorrt_version"] and info["gpu_name"] and info["compute_capability"]
    assert info["timing_cache_sha256"] and info["layers"]["layer_count"] > 0
    if "fp16" in passes:
        assert "FP16" in {p.upper() for p in info["layers"]["precisions"]}


@pytest.mark.gpu
def test_tensorrt_sparse_build_reports_sparse_tactics_or_says_it_gained_nothing(tmp_path: Path) -> None:
    _require("tensorrt")
    file, dims = MODELS["mini_resnet"]
    result = quick_build(
        str(EXAMPLES / file), tmp_path, target="tensorrt", passes=("O1", "sparsity24"), dynamic=dims, tolerance=1.0
    )
    layers = result.manifest.target.info["layers"]
    assert layers["sparse_layers"] or "gained nothing" in layers["note"]


@pytest.mark.gpu
def test_tensorrt_bundle_round_trip_on_the_gpu(tmp_path: Path) -> None:
    _require("tensorrt")
    file, dims = MODELS["tiny_transformer"]
    prepared = quick_build(
        str(EXAMPLES / file),
        tmp_path,
        target="tensorrt",
        passes=("O1", "fp16"),
        dynamic=dims,
        tolerance=1e-2,
        prepare_only=True,
        bench=True,
    )
    result = finish(prepared.path, tmp_path / "art", cache_dir=tmp_path / "cache")
    _check(result.path, 1e-2)
    assert result.manifest.target.name == "tensorrt" and result.manifest.target.info["timing_cache_sha256"]


@pytest.mark.neuron
@pytest.mark.parametrize("model", list(MODELS))
def test_neuron_builds_validates_and_benchmarks(model: str, tmp_path: Path) -> None:
    _require("neuron")
    file, dims = MODELS[model]
    result = quick_build(
        str(EXAMPLES / file),
        tmp_path,
        target="neuron",
        passes=("O1",),
        dynamic=dims,
        tolerance=1e-3,  # fp32 throughout: the target passes --auto-cast none without a precision pass
        bench=True,
        target_options={"pad_dims": "batch"},
    )
    _check(result.path, 1e-2)
    info = result.manifest.target.info
    assert info["neuronx_cc_version"] and info["torch_neuronx_version"] and info["instance_family"]
