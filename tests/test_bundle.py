"""Remote builds: ``--prepare-only`` bundles and ``finish``, for real up to the TensorRT SDK call."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from aotforge.artifacts.hashing import require_intact
from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.api import build
from aotforge.compiler.bundle import finish
from aotforge.compiler.bundle_format import BUNDLE_JSON, VALIDATION_NPZ, read_bundle
from aotforge.compiler.cli import main
from aotforge.core.errors import ArtifactError, OptionsError, TargetUnavailableError
from aotforge.targets import get_target

MODEL = "examples/mini_resnet.py"
TRT_MISSING = not get_target("tensorrt").probe().available


def _prepare(out: Path, passes: tuple[str, ...] = ("O1", "fp16"), target: str = "tensorrt") -> Path:
    result = build(
        MODEL, target=target, prepare_only=True, passes=passes, dynamic=("batch=1:2:4",), tolerance=1e-2, out=out
    )
    assert result.manifest.validation["pending"] == "aotforge finish"
    return result.path


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _prepare(tmp_path_factory.mktemp("prep"))


def test_prepare_only_writes_a_checked_fp16_ir_with_the_planned_profiles(fp16_bundle: Path) -> None:
    onnx.checker.check_model(str(fp16_bundle / "model.onnx"))
    model = onnx.load(str(fp16_bundle / "model.onnx"))
    fp16 = onnx.TensorProto.FLOAT16
    assert any(init.data_type == fp16 for init in model.graph.initializer), "the fp16 pass's weights are kept"
    data = read_bundle(fp16_bundle)
    assert data["plan"]["profiles"] == [
        {"input": "image", "min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [4, 3, 32, 32]}
    ]
    assert data["plan"]["flags"] == []
    assert data["target_options"]["builder_optimization_level"] == 3
    assert data["manifest_draft"]["validation"]["tolerance"] == 1e-2
    with np.load(fp16_bundle / VALIDATION_NPZ, allow_pickle=False) as arrays:
        first = data["validation_index"][0]
        assert arrays[first["inputs"]["image"]].shape == (2, 3, 32, 32)
        assert arrays[first["outputs"]["logits"]].shape == (2, 10)


@pytest.mark.skipif(not TRT_MISSING, reason="this host has TensorRT: the refusal cannot be shown")
def test_finish_without_tensorrt_refuses_with_the_probe_reason_and_writes_nothing(
    fp16_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["finish", str(fp16_bundle), "--out", str(out)])
    assert result.exit_code == TargetUnavailableError.exit_code
    assert "tensorrt needs, and this host lacks: python package 'tensorrt'" in result.output
    assert not out.exists() or not any(out.rglob("manifest.json"))


def test_finish_on_onnxruntime_compiles_validates_benchmarks_and_stores(fp16_bundle: Path, tmp_path: Path) -> None:
    result = finish(fp16_bundle, tmp_path, target_name="onnxruntime")
    m = read_manifest(result.path)
    require_intact(result.path, m)
    assert m.target.name == "onnxruntime" and m.version == 1
    assert m.validation["passed"] and "stored in the bundle" in m.validation["reference"]
    assert 0 < m.validation["metrics"]["logits"]["rel_l2"] <= 1e-2  # fp16 changed numerics, within budget
    assert m.benchmark is not None and m.benchmark["runs"] >= 1
    assert m.build["bundle"]["sha256"]
    assert [p["name"] for p in m.passes] == ["fold", "dce", "fp16"]
    assert (result.path / "model.onnx").read_bytes() == (fp16_bundle / "model.onnx").read_bytes()
    again = finish(fp16_bundle, tmp_path, target_name="onnxruntime", bench=False)
    assert again.manifest.version == 2 and again.manifest.benchmark is None


def test_cli_round_trip_for_a_cpu_target(tmp_path: Path) -> None:
    runner = CliRunner()
    prep = runner.invoke(
        main,
        ["compile", MODEL, "-t", "onnxruntime", "--prepare-only", "--out", str(tmp_path), "--passes", "O1"],
    )
    assert prep.exit_code == 0, prep.output
    bundle = Path(prep.output.strip().splitlines()[-1])
    done = runner.invoke(main, ["finish", str(bundle), "--out", str(tmp_path / "art"), "--no-bench"])
    assert done.exit_code == 0, done.output
    artifact = Path(done.output.strip().splitlines()[-1])
    assert read_manifest(artifact).validation["metrics"]["logits"]["rel_l2"] < 1e-5


def _copy(bundle: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(bundle, dest / "b"))


def test_a_changed_model_file_is_refused(fp16_bundle: Path, tmp_path: Path) -> None:
    b = _copy(fp16_bundle, tmp_path)
    (b / "model.onnx").write_bytes((b / "model.onnx").read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match=r"model.onnx missing, added or changed"):
        finish(b, tmp_path / "out", target_name="onnxruntime")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("manifest.json"))


def test_an_edited_bundle_json_or_an_added_file_is_refused(fp16_bundle: Path, tmp_path: Path) -> None:
    b = _copy(fp16_bundle, tmp_path)
    data = json.loads((b / BUNDLE_JSON).read_text())
    data["manifest_draft"]["validation"]["tolerance"] = 1.0  # loosening the budget must not pass unnoticed
    (b / BUNDLE_JSON).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="modified after it was written"):
        read_bundle(b)
    c = _copy(fp16_bundle, tmp_path / "c")
    (c / "extra.bin").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="extra.bin"):
        read_bundle(c)


def test_a_bundle_of_another_format_version_is_refused(fp16_bundle: Path, tmp_path: Path) -> None:
    b = _copy(fp16_bundle, tmp_path)
    data = json.loads((b / BUNDLE_JSON).read_text())
    data["format_version"] = 99
    (b / BUNDLE_JSON).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="bundle format 99"):
        read_bundle(b)


def test_not_a_bundle_and_neuron_prepare_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not a build bundle"):
        read_bundle(tmp_path)
    with pytest.raises(OptionsError, match="neuronx-cc compiles from the torch program"):
        _prepare(tmp_path, passes=("O1",), target="neuron")


def test_sparsity_bundle_plans_sparse_weights(tmp_path: Path) -> None:
    bundle = _prepare(tmp_path, passes=("O1", "sparsity24"))
    assert read_bundle(bundle)["plan"]["flags"] == ["SPARSE_WEIGHTS"]


def test_prepare_only_keeps_the_int8_qdq_the_pass_wrote(tmp_path: Path) -> None:
    bundle = _prepare(tmp_path, passes=("O1", "int8"))
    onnx.checker.check_model(str(bundle / "model.onnx"))
    graph = onnx.load(str(bundle / "model.onnx")).graph
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in graph.node}
    # TensorRT's pass defaults, not the int8 pass's ORT-friendly uint8 ones: signed, zero point 0.
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    zeros = [inits[n.input[2]] for n in graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2]
    assert zeros and all(z.dtype == np.int8 and not z.any() for z in zeros)


def test_prepare_only_refuses_qdq_tensorrt_cannot_build(tmp_path: Path) -> None:
    from aotforge.core.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="int8.activations=int8"):
        build(
            MODEL,
            target="tensorrt",
            prepare_only=True,
            passes=("O1", "int8"),
            pass_params={"int8": {"activations": "uint8"}},
            tolerance=1e-2,
            out=tmp_path,
        )
    assert not any(tmp_path.rglob("*.bundle"))
