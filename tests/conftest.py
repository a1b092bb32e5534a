"""Shared fixtures: the targets this host can run, and a quiet, fast build helper."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import onnx
import pytest

from aotforge.compiler.api import BuildResult, build
from aotforge.compiler.benchmark import BenchOptions
from aotforge.targets import get_target

warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ONNX_LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
CPU_TARGETS = [t for t in ("tvm", "onnxruntime") if get_target(t).probe().available]
FAST_BENCH = BenchOptions(warmup=1, min_runs=3, max_runs=5, max_seconds=0.5)


def quick_build(model: Any, out: Path, **overrides: Any) -> BuildResult:
    """A build with few validation samples and no benchmark unless asked, for test speed."""
    overrides.setdefault("bench", False)
    overrides.setdefault("validation_samples", 2)
    overrides.setdefault("bench_options", FAST_BENCH)
    return build(model, out=out, **overrides)


@pytest.fixture(params=CPU_TARGETS)
def cpu_target(request: pytest.FixtureRequest) -> str:
    return str(request.param)
