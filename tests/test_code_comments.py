"""The code's comments and docstrings say why in words: a measured figure (a duration, a rate, a ratio, a share, a
load average) belongs on docs/benchmarks.md, generated from the benches' JSON, not in the code."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import aotforge
from tests.test_readme_commands import FIGURE

PACKAGE = Path(aotforge.__file__).resolve().parent

#: Figures that are facts, not measurements: a setting's value, an instruction's width, a shape, a URL.
FACTS = {
    ("compiler/options.py", "5%"),  # what max_perplexity_increase=0.05 means
    ("targets/onnxruntime/decoder.py", "20 us"),  # the spin the target default sets
    ("targets/tensorrt/report.py", "10x"),  # a URL of NVIDIA's migration guide
    ("targets/tensorrt/report.py", "11x"),
    ("targets/tvm/kernels/vnni_conv.py", "9x"),  # an im2col matrix of a 3x3 window
    ("targets/tvm/kernels/vnni_dense.py", "4x"),  # vpdpbusd's multiply-adds against an fp32 FMA
    ("targets/tvm/schedules/matmul.py", "4x"),  # 16-lane vectors against 4- or 1-lane ones
    ("targets/tvm/schedules/matmul.py", "16x"),
    ("targets/tvm/steps.py", "3x"),  # q, k and v as one matmul
}


def _prose(source: str) -> list[str]:
    """Every comment and docstring of ``source``."""
    texts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            texts.append(ast.get_docstring(node, clean=False) or "")
    return texts


def test_no_measured_figure_is_typed_into_a_comment_or_docstring() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for text in _prose(path.read_text()):
            found += [f"{rel}: {m.group(0)}" for m in FIGURE.finditer(text) if (rel, m.group(0)) not in FACTS]
    assert not found, "figures belong on docs/benchmarks.md (a pointer to it where the reason is a number):\n" + (
        "\n".join(found)
    )
