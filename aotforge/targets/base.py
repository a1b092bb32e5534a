"""The interface every target implements: probe, plan, compile, load.

A target is one class, in ``targets/<name>/target.py`` (or ``targets/<name>.py`` when one module
is enough). It never imports its vendor SDK at module import time, so ``import aotforge.targets``
works on any host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Arrays", "BuildContext", "CompileResult", "ProbeResult", "Runner", "Target", "options_from_dict"]

import numpy as np
import onnx_ir as ir

from aotforge.core.errors import UnsupportedModelError
from aotforge.core.options import options_from_dict
from aotforge.core.spec import IOSpec

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """Whether this host can compile and run for a target; if not, exactly what is missing."""

    available: bool
    reason: str = ""
    can_compile: bool | None = None
    details: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def compiles(self) -> bool:
        return self.available if self.can_compile is None else self.can_compile


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """What ``compile`` wrote into the work dir, and what the manifest records about it."""

    files: tuple[str, ...]
    target_info: Mapping[str, Any]
    toolchain: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a target may know about the build beyond the IR: passed explicitly, never global."""

    io: IOSpec
    passes: tuple[str, ...] = ()
    source_format: str = "onnx"
    #: The passes of ``passes`` whose output holds com.microsoft contrib ops (the compiler knows which).
    contrib_passes: tuple[str, ...] = ()
    torch_program: Any = None
    workdir: Path | None = None


class Runner(Protocol):
    """A loaded artifact: named numpy inputs in, named numpy outputs out."""

    def run(self, inputs: Arrays) -> Arrays: ...


class Target(Protocol):
    """One deployment backend."""

    name: str
    options_type: type

    def probe(self) -> ProbeResult: ...

    def plan(self, model: ir.Model, options: Any, ctx: BuildContext) -> None:
        """Refuse, before any compile work, what this target cannot honour."""

    def compile(self, model: ir.Model, options: Any, ctx: BuildContext, workdir: Path) -> CompileResult: ...

    def load(self, artifact_dir: Path, manifest: Mapping[str, Any]) -> Runner: ...


def refuse_contrib_ops(target: str, model: ir.Model, ctx: BuildContext) -> None:
    """For targets without ORT's contrib ops: refuse a model holding them, or a pass that emits them."""
    domains = sorted({n.domain for n in model.graph.all_nodes() if n.domain not in ("", "ai.onnx", "ai.onnx.ml")})
    if domains:
        raise UnsupportedModelError(
            f"{target} cannot run ops of domain(s) {', '.join(domains)} (ONNX Runtime contrib ops): "
            "export the model with standard ONNX ops, or use --target onnxruntime"
        )
    emitting = list(ctx.contrib_passes)
    if emitting:
        raise UnsupportedModelError(
            f"{target} cannot honour pass {emitting[0]!r}: it emits com.microsoft contrib ops only "
            "onnxruntime runs; use pass 'fuse' (standard ONNX fusions) instead"
        )
