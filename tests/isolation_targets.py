"""The real onnxruntime target with its compile replaced by one that crashes or hangs: tests/test_isolation.py
points the target table at these, and the spawned worker imports them by the class's name."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any

from aotforge.targets.base import CompileResult
from aotforge.targets.onnxruntime import OrtTarget


class SegfaultingOrt(OrtTarget):
    def compile(self, model: Any, options: Any, ctx: Any, workdir: Path) -> CompileResult:
        ctypes.string_at(0)  # a real SIGSEGV in the worker
        raise AssertionError("unreachable")


class HangingOrt(OrtTarget):
    def compile(self, model: Any, options: Any, ctx: Any, workdir: Path) -> CompileResult:
        time.sleep(3600)
        raise AssertionError("unreachable")


class HangingRunOrt(OrtTarget):
    """Compiles, then hangs in the artifact's first validation run."""

    def load(self, artifact_dir: Path, record: Any, io: Any) -> Any:
        class Stuck:
            def run(self, _inputs: Any) -> Any:
                time.sleep(3600)

        return Stuck()
