"""Same inputs, same toolchain: same model.onnx hash and the same manifest outside ``build``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, quick_build


@pytest.mark.parametrize("model", ["mini_resnet.py", "tiny_transformer.py"])
def test_two_builds_are_identical(model: str, cpu_target: str, tmp_path: Path) -> None:
    # tiny_transformer has no attention mask: tvm (static shapes) runs one declared seq size of it.
    dims = ["seq=16"] if (model, cpu_target) == ("tiny_transformer.py", "tvm") else []
    first = quick_build(str(EXAMPLES / model), tmp_path / "a", target=cpu_target, dynamic=dims)
    second = quick_build(str(EXAMPLES / model), tmp_path / "b", target=cpu_target, dynamic=dims)
    assert first.manifest.files["model.onnx"] == second.manifest.files["model.onnx"]
    assert first.manifest.reproducible_part() == second.manifest.reproducible_part()
