"""The CLI doors: compile prints the artifact path last; targets, inspect, verify and run work on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.sample_inputs import make_inputs
from aotforge.core.spec import IOSpec
from tests.conftest import EXAMPLES, ONNX_LIGHT
from tests.test_errors import invoke_cli


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli")
    proc = invoke_cli(
        "compile",
        str(EXAMPLES / "mini_resnet.py"),
        "--target",
        "onnxruntime",
        "--out",
        str(out),
        "--bench-seconds",
        "0.5",
    )
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path == out / "mini_resnet" / "1" / "onnxruntime"
    return path


def test_targets_lists_all_four_with_reasons() -> None:
    proc = invoke_cli("targets")
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines()}
    assert set(lines) == {"tvm", "onnxruntime", "tensorrt", "neuron"}
    assert "available" in lines["onnxruntime"] and "unavailable" not in lines["onnxruntime"]
    assert "tensorrt" in lines["tensorrt"].split(None, 1)[1]


def test_inspect_summarises(artifact: Path) -> None:
    proc = invoke_cli("inspect", str(artifact))
    assert proc.returncode == 0
    assert "mini_resnet v1 for onnxruntime" in proc.stdout and "p50" in proc.stdout


def test_verify_passes_then_catches_tampering(artifact: Path, tmp_path: Path) -> None:
    assert invoke_cli("verify", str(artifact)).returncode == 0
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 1
    (copy / "model.onnx").write_bytes(bytes(data))
    proc = invoke_cli("verify", str(copy))
    assert proc.returncode == 4 and "model.onnx: sha256" in proc.stderr  # EXIT_INTEGRITY


def test_run_saves_outputs(artifact: Path, tmp_path: Path) -> None:
    io = IOSpec.from_dict(read_manifest(artifact).io)
    np.savez(tmp_path / "x.npz", **make_inputs(io, io.bound_sizes(), seed=1, count=1)[0])
    proc = invoke_cli("run", str(artifact), "--inputs", str(tmp_path / "x.npz"), "--save", str(tmp_path / "y.npz"))
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "y.npz") as y:
        # No --dynamic: the batch dim's opt is the example inputs' batch (2), never a silent 1.
        assert y["logits"].shape == (io.bound_sizes()["batch"], 10) == (2, 10)


def test_onnx_file_through_cli(tmp_path: Path) -> None:
    proc = invoke_cli(
        "compile", str(ONNX_LIGHT / "light_squeezenet.onnx"), "-t", "onnxruntime", "--out", str(tmp_path), "--no-bench"
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip().splitlines()[-1]).is_dir()


def test_run_with_wrong_shape_is_one_line(artifact: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", image=np.zeros((1, 3, 7), dtype=np.float32))
    proc = invoke_cli("run", str(artifact), "--inputs", str(tmp_path / "bad.npz"))
    assert proc.returncode == 2
    assert "image' of shape (1, 3, 7), which does not fit" in proc.stderr and "Traceback" not in proc.stderr
    assert "batch 1..8 (opt 2)" in proc.stderr  # the error names what the artifact takes


def test_compile_signs_and_pushes(tmp_path: Path) -> None:
    assert invoke_cli("keygen", "--out", str(tmp_path / "keys")).returncode == 0
    private, public = sorted((tmp_path / "keys").iterdir(), key=lambda p: "public" in p.name)
    registry = tmp_path / "registry"
    proc = invoke_cli(
        "compile",
        str(ONNX_LIGHT / "light_squeezenet.onnx"),
        "--target",
        "onnxruntime",
        "--out",
        str(tmp_path / "out"),
        "--no-bench",
        "--sign-key",
        str(private),
        "--push",
        str(registry),
    )
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert "pushed to" in proc.stderr
    verified = invoke_cli("verify", str(path), "--public-key", str(public))
    assert verified.returncode == 0, verified.stderr
    listed = invoke_cli("list", "--registry", str(registry))
    assert "light_squeezenet" in listed.stdout, listed.stdout + listed.stderr


def test_tune_flags_are_tvm_options_and_refused_by_name_elsewhere(tmp_path: Path) -> None:
    model = str(EXAMPLES / "mini_resnet.py")
    proc = invoke_cli("compile", model, "-t", "onnxruntime", "--tune-trials", "8", "--out", str(tmp_path))
    assert proc.returncode == 2 and "tune_trials" in proc.stderr
    proc = invoke_cli(
        "compile", model, "-t", "tvm", "--tune-trials", "8", "--target-opt", "dynamic=true", "--out", str(tmp_path)
    )
    assert proc.returncode == 2 and "tun" in proc.stderr and "dynamic" in proc.stderr
    assert not any(tmp_path.iterdir())
