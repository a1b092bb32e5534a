"""Every error a user can cause: one clear line, a non-zero exit, nothing left behind.

The cases run the command in this process (``invoke_cli``: the same command, exit status and stderr a terminal
gets) rather than in a new interpreter each, whose start and imports were most of their time; ``run_cli`` (a real
``python -m aotforge`` process) shows the traceback of ``--debug``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from aotforge.compiler.cli import main
from aotforge.core.errors import EXIT_TARGET_UNAVAILABLE, EXIT_USER, EXIT_VALIDATION
from tests.conftest import EXAMPLES, ONNX_LIGHT


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m aotforge ARGS`` in a new process: for what only a real process shows (a traceback, C++ logging
    on the terminal, the environment a command starts with)."""
    return subprocess.run(
        [sys.executable, "-m", "aotforge", *args], capture_output=True, text=True, timeout=600, check=False
    )


def invoke_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process (click's runner): its exit status, stdout and stderr as ``run_cli`` gives
    them, without a new interpreter and its imports for each command."""
    ran = CliRunner().invoke(main, list(args))
    return subprocess.CompletedProcess(["aotforge", *args], ran.exit_code, ran.stdout, ran.stderr)


def _unsupported_op_model(path: Path) -> Path:
    """A model with an op no backend implements (a custom domain)."""
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, path)
    return path


def _truncated(path: Path) -> Path:
    data = (ONNX_LIGHT / "light_squeezenet.onnx").read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


CASES = {
    "missing file": (lambda d: ["/nonexistent/model.onnx"], "does not exist"),
    "not onnx": (lambda d: [str(_write(d / "x.onnx", b"hello, not a model"))], "not a valid ONNX model"),
    "truncated onnx": (lambda d: [str(_truncated(d / "t.onnx"))], "not a valid ONNX model"),
    "unknown target": (lambda d: [str(EXAMPLES / "mini_resnet.py"), "--target", "cuda9"], "unknown target 'cuda9'"),
    "unavailable target": (
        lambda d: [str(EXAMPLES / "mini_resnet.py"), "--target", "tensorrt"],
        "not available on this host",
    ),
    "unsupported op": (lambda d: [str(_unsupported_op_model(d / "u.onnx")), "--target", "onnxruntime"], "FancyOp"),
    "unknown dynamic dim": (lambda d: [str(EXAMPLES / "mini_resnet.py"), "--dynamic", "seq=1:8"], "no model input has"),
    "bad dim range": (lambda d: [str(EXAMPLES / "mini_resnet.py"), "--dynamic", "batch=8:2"], "min <= opt <= max"),
    "unknown pass": (lambda d: [str(EXAMPLES / "mini_resnet.py"), "--passes", "fold,magic"], "unknown pass 'magic'"),
    "unknown target option": (
        lambda d: [str(EXAMPLES / "mini_resnet.py"), "--target-opt", "speed=11"],
        "unknown tvm option",
    ),
    "stray pass parameter": (
        lambda d: [str(EXAMPLES / "mini_resnet.py"), "--pass-opt", "int8.method=minmax"],
        "not in --passes",
    ),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_user_error_is_one_line_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    args, expected = CASES[case]
    out = tmp_path / "out"
    proc = invoke_cli("compile", *args(tmp_path), "--out", str(out), "--no-bench")
    assert proc.returncode == (EXIT_TARGET_UNAVAILABLE if case == "unavailable target" else EXIT_USER), proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].lower().startswith("error: ")
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file())


def test_validation_failure_leaves_no_artifact(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [str(EXAMPLES / "mini_resnet.py"), "--target", "onnxruntime", "--out", str(out), "--tolerance", "1e-12"]
    proc = invoke_cli("compile", *args, "--no-bench")
    assert proc.returncode == EXIT_VALIDATION, proc.stderr
    assert "does not match the source model" in proc.stderr and "rel L2" in proc.stderr
    assert not any(p for p in out.rglob("*") if p.is_file())


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_cli("--debug", "compile", "/nonexistent/model.onnx")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_an_ort_message_keeps_the_cause_from_its_later_lines() -> None:
    """Before: ORT's run-time shape error lost its cause, which ORT prints on the lines after the first."""
    from aotforge.core.errors import describe

    ort_text = (
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x for the following indices\n"
        " index: 1 Got: 3 Expected: 8\n Please fix either the inputs/outputs or the model."
    )
    text = describe(RuntimeError(ort_text))
    assert "\n" not in text and "index: 1 Got: 3 Expected: 8" in text
    assert describe(RuntimeError("first\nsecond")) == "first"
