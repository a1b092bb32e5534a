"""Malformed models are one ``error:`` line naming the cause, never a traceback.

Before: declared dims of 2^40 / 2^62 (numpy MemoryError drawing inputs), negative dims, an unknown
element type (onnx_ir SerdeError) were tracebacks; a zero-size dim built and "passed" over 0
elements; a graph with no outputs failed with ORT's "At least one output should be requested"; a
source model outputting NaN was reported as the target's fault only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.compiler.cli import main
from tests import hostile_models

CASES = {
    "dim_2_40": "over the 4 GiB",
    "dim_2_62": "over the 4 GiB",
    "dim_negative": "negative dim",
    "dim_zero": "zero-size dim",
    "elem_type_99": "99 is not a valid DataType",
    "no_outputs": "has no graph outputs",
}


def compile_cli(model: Path, target: str, out: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["compile", str(model), "--target", target, "--out", str(out), "--no-bench", *extra]
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_model_is_one_error_line(case: str, cpu_target: str, tmp_path: Path) -> None:
    model = hostile_models.write(case, tmp_path)
    code, output = compile_cli(model, cpu_target, tmp_path / "out")
    assert code != 0
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and CASES[case] in lines[0], output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_source_producing_nan_is_said_to(tmp_path: Path) -> None:
    code, output = compile_cli(hostile_models.write("nan_source", tmp_path), "tvm", tmp_path / "out")
    assert code != 0 and output.startswith("error: ")
    assert "the source model itself outputs NaN / Inf on the validation inputs (y" in output, output


def _garbage_npz(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 4)


def _truncated_npz(path: Path) -> None:
    path.write_bytes(b"PK\x03\x04" + b"\0" * 20)


def _object_npz(path: Path) -> None:
    import io
    import zipfile

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", buffer.getvalue())


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (_garbage_npz, "is not a .npz file"),  # before: "This file contains pickled (object) data"
        (_truncated_npz, "is a damaged or incomplete .npz file"),  # before: an internal error (BadZipFile)
        (_object_npz, "save plain numeric arrays, not Python objects"),
    ],
)
def test_a_bad_sample_inputs_file_is_one_clear_line(write, message: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.tiny_models import relu_add

    samples = tmp_path / "s.npz"
    write(samples)
    code, output = compile_cli(
        relu_add(tmp_path / "m.onnx"), "onnxruntime", tmp_path / "out", "--sample-inputs", str(samples)
    )
    errors = [ln for ln in output.splitlines() if ln.startswith("error: ")]
    assert code != 0 and len(errors) == 1 and message in errors[0] and "Traceback" not in output, output
