"""The interface every target implements: probe, plan, compile, load.

A target is one module (``targets/<name>_target.py``) with one class. It never imports its
vendor SDK at module import time, so ``import targets`` works on any host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx_ir as ir

from compiler.errors import OptionsError, UnsupportedModelError
from compiler.spec import IOSpec

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


def refuse_contrib_ops(target: str, model: ir.Model, passes: tuple[str, ...]) -> None:
    """For targets without ORT's contrib ops: refuse a model holding them, or a pass that emits them."""
    from passes import CONTRIB_OP_PASSES

    domains = sorted({n.domain for n in model.graph.all_nodes() if n.domain not in ("", "ai.onnx", "ai.onnx.ml")})
    if domains:
        raise UnsupportedModelError(
            f"{target} cannot run ops of domain(s) {', '.join(domains)} (ONNX Runtime contrib ops): "
            "export the model with standard ONNX ops, or use --target onnxruntime"
        )
    emitting = [p for p in passes if p in CONTRIB_OP_PASSES]
    if emitting:
        raise UnsupportedModelError(
            f"{target} cannot honour pass {emitting[0]!r}: it emits com.microsoft contrib ops only "
            "onnxruntime runs; use pass 'fuse' (standard ONNX fusions) instead"
        )


def options_from_dict(cls: type, data: Mapping[str, Any], *, what: str) -> Any:
    """Build a frozen options dataclass from loose values, rejecting unknown keys by name.

    Values given as strings (from ``--target-opt key=value``) are converted to the field's
    default's type, so the CLI, recipes and Python all go through this one function.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise OptionsError(f"unknown {what} option(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
    values = {}
    for key, value in data.items():
        default = fields[key].default
        values[key] = _coerce(value, default, f"{what} option {key}")
    return cls(**values)


def _coerce(value: Any, default: Any, what: str) -> Any:
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("1", "true", "yes")
        if isinstance(default, tuple):
            return tuple(v for v in value.split(",") if v)
        return type(default)(value)
    except ValueError:
        raise OptionsError(f"{what} expects a {type(default).__name__}, got {value!r}") from None
