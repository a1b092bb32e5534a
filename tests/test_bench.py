"""``aotforge bench`` and the build's benchmark: one measuring process of the artifact's own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import CPU_TARGETS, FAST_BENCH, quick_build
from tests.test_errors import invoke_cli


def tiny_model(path: Path) -> Path:
    """x[batch, 16] @ W -> Relu: an ONNX file with a dynamic batch dim."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8], np.linspace(-1, 1, 128, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bench")
    result = quick_build(
        str(tiny_model(tmp / "tiny.onnx")), tmp / "out", target="onnxruntime", dynamic=["batch=1:2:8"], bench=True
    )
    return result.path


def test_build_benchmark_is_the_runner_process(artifact: Path) -> None:
    bench = json.loads((artifact / "manifest.json").read_text())["benchmark"]
    assert bench["runs"] >= FAST_BENCH.min_runs and bench["batch"] == 2
    assert bench["p50_ms"] <= bench["p90_ms"] <= bench["p99_ms"] and bench["std_ms"] >= 0
    # The build process holds torch, onnx and ORT's quantizer (hundreds of MB); the runner's process does not.
    assert 0 < bench["runner_rss_mb"] < bench["peak_rss_mb"] < 400


def test_bench_cli_json_per_thread_count(artifact: Path) -> None:
    proc = invoke_cli(
        "bench", str(artifact), "--threads", "1,2", "--batch", "4", "--seconds", "0.2", "--warmup", "1", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["name"], report["target"], report["inputs"]["x"]["shape"]) == ("tiny", "onnxruntime", [4, 16])
    assert [r["threads"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        assert r["batch"] == 4 and r["runs"] >= 3 and r["throughput_per_s"] > 0
        assert {"p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms", "peak_rss_mb", "runner_rss_mb"} <= set(r)


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_bench_child_imports_no_build_library_and_records_its_threads(target: str, tmp_path: Path) -> None:
    """Not torch, transformers or ORT's quantizer; tvm_ffi imports torch when it can, the child blocks it. Asked for
    no thread count, it records the one ``OMP_NUM_THREADS`` gave the runtime (the suite sets it: tests/conftest)."""
    from aotforge.compiler.bench import bench_artifact, bench_inputs
    from aotforge.compiler.benchmark import BenchOptions
    from aotforge.core.runtime_threads import environment_threads
    from aotforge.core.spec import IOSpec

    path = quick_build(str(tiny_model(tmp_path / "tiny.onnx")), tmp_path / "out", target=target).path
    io = IOSpec.from_dict(json.loads((path / "manifest.json").read_text())["io"])
    inputs, batch = bench_inputs(io)
    (run,) = bench_artifact(path, inputs, batch=batch, options=BenchOptions(1, 3, 5, 0.1))
    assert run.build_modules == [] and len(run.times_ms) == run.result["runs"]
    assert run.result["threads"] == environment_threads() > 0


def test_bench_refuses_a_batch_outside_the_range_and_a_tampered_artifact(artifact: Path, tmp_path: Path) -> None:
    proc = invoke_cli("bench", str(artifact), "--batch", "64", "--seconds", "0.1")
    assert proc.returncode == 2 and "batch" in proc.stderr and "Traceback" not in proc.stderr
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    (copy / "model.onnx").write_bytes(b"x" + (copy / "model.onnx").read_bytes())
    proc = invoke_cli("bench", str(copy), "--seconds", "0.1")
    assert proc.returncode != 0 and "model.onnx: sha256" in proc.stderr


def test_onnxruntime_load_takes_the_record_thread_count(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``aotforge bench --threads N`` asks through the record; session.json's count is only the default, and where
    it asks for none the session takes ``OMP_NUM_THREADS`` (a positive count), else ONNX Runtime's own."""
    import dataclasses

    from aotforge.artifacts.signing import verified_manifest
    from aotforge.core.spec import IOSpec
    from aotforge.targets import get_target
    from aotforge.targets.onnxruntime import reference_session

    manifest = verified_manifest(artifact)
    io = IOSpec.from_dict(manifest.io)
    target = get_target("onnxruntime")
    for threads in (1, 3):
        record = dataclasses.replace(manifest.target, options={**manifest.target.options, "intra_op_threads": threads})
        runner = target.load(artifact, record, io)
        assert runner.session.get_session_options().intra_op_num_threads == threads
    stored = json.loads((artifact / "session.json").read_text())["intra_op_threads"]
    assert stored == 0  # none asked at build time: the environment's count, else ONNX Runtime's own
    for variable, threads in (("3", 3), ("", 0), ("x", 0)):
        monkeypatch.setenv("OMP_NUM_THREADS", variable)
        runner = target.load(artifact, manifest.target, io)
        assert runner.session.get_session_options().intra_op_num_threads == threads
        reference = reference_session(str(artifact / "model.onnx"))  # a source model's, the build's reference
        assert reference.get_session_options().intra_op_num_threads == threads


@pytest.mark.parametrize("kind", ["artifact", "tvm-untuned"])
def test_bench_worker_times_every_kind_without_a_model_file(kind: str, artifact: Path) -> None:
    """``make bench``'s per-runtime child: each kind that needs no torch model file runs and reports a p50."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    worker = root / "tools" / "bench_worker.py"
    args = ["--artifact", str(artifact), "--seconds", "0.2", "--runs", "3", "--warmup", "1"]
    done = subprocess.run([sys.executable, str(worker), kind, *args], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["p50_ms"] > 0 and result["runs"] >= 3
