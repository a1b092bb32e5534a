"""Calibration loading: a directory of .npy / .npz, a module.py:function callable, and clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from aotforge.core.calibration import load_calibration
from aotforge.core.errors import OptionsError
from aotforge.passes.manager import run_passes
from aotforge.passes.quantize_static import QuantizeStaticParams, QuantizeStaticPass
from tests.pass_models import INT8_REL_L2, feeds_for, mlp, rel_l2, run

ONE = {"x": (2, np.dtype(np.float32))}
TWO = {"ids": (2, np.dtype(np.int64)), "mask": (2, np.dtype(np.int64))}

CALLABLE = """
import numpy as np

def samples():
    rng = np.random.default_rng(0)
    return ({"x": rng.standard_normal((4, 32)).astype(np.float32)} for _ in range(6))

def nothing():
    return []

def broken():
    raise RuntimeError("tokenizer missing")
"""


def test_directory_of_npy_and_npz(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.ones((3, 4, 32), np.float64))  # a stack of 3, cast to float32
    np.savez(tmp_path / "b.npz", ids=np.zeros((2, 8), np.int32), mask=np.ones((2, 8), np.int32))
    one = tmp_path / "one"
    one.mkdir()
    (tmp_path / "a.npy").rename(one / "a.npy")
    got = load_calibration(str(one), ONE, 10)
    assert len(got) == 3 and got[0]["x"].dtype == np.float32 and got[0]["x"].shape == (4, 32)
    two = load_calibration(str(tmp_path), TWO, 10)
    assert len(two) == 1 and two[0]["ids"].dtype == np.int64


def test_callable_feeds_the_int8_pass(tmp_path: Path) -> None:
    (tmp_path / "calib.py").write_text(CALLABLE)
    got = load_calibration(f"{tmp_path / 'calib.py'}:samples", ONE, 4)
    assert len(got) == 4
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    pass_ = QuantizeStaticPass(QuantizeStaticParams(calibration_dir=f"{tmp_path / 'calib.py'}:samples", samples=6))
    run_passes(model, [pass_])
    assert pass_.stats["calibration_samples"] == 6
    assert rel_l2(run(model, feeds)[0], expected) < INT8_REL_L2


@pytest.mark.parametrize(
    ("setup", "inputs", "match"),
    [
        ("empty", ONE, "no .npz or .npy files in calibration directory"),
        ("names", TWO, r"holds \['tokens'\] but the model's inputs are \['ids', 'mask'\]"),
        ("missing", ONE, "neither a directory nor module.py:function"),
        (":nothing", ONE, "produced no samples"),
        (":broken", ONE, "failed: RuntimeError: tokenizer missing"),
        (":absent", ONE, "has no callable 'absent'"),
        ("nomodule", ONE, "does not exist"),
    ],
)
def test_clear_errors(tmp_path: Path, setup: str, inputs: dict, match: str) -> None:
    (tmp_path / "calib.py").write_text(CALLABLE)
    source = str(tmp_path / "d")
    if setup in ("empty", "names"):
        (tmp_path / "d").mkdir()
        if setup == "names":
            np.savez(tmp_path / "d" / "a.npz", tokens=np.zeros((2, 8), np.int64))
    elif setup.startswith(":"):
        source = f"{tmp_path / 'calib.py'}{setup}"
    elif setup == "nomodule":
        source = f"{tmp_path / 'other.py'}:samples"
    with pytest.raises(OptionsError, match=match):
        load_calibration(source, inputs, 8)


def test_callable_imports_project_packages_from_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "data.py").write_text("import numpy as np\nX = np.ones((2, 4), np.float32)\n")
    (tmp_path / "proj" / "calib.py").write_text(
        "def feeds():\n    from proj.data import X  # imported when called, as examples/minilm_sentences does\n"
        "    return [{'x': X}]\n"
    )
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    samples = load_calibration("proj/calib.py:feeds", {"x": (2, np.dtype(np.float32))}, 4)
    assert len(samples) == 1 and samples[0]["x"].shape == (2, 4)
    assert sys.path == before  # nothing left behind
