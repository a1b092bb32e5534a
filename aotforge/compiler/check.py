"""``aotforge check``: what a target's importer takes of a model, in seconds, before any compile.

The model goes through the frontend (its IO spec and dim ranges, as a build resolves them) and the
target's pre-flight (``Target.coverage``; tvm: the ONNX-level import steps and the importer's converter
table), so every node it cannot take is named at once. A target without one has no op-level check yet:
the build's own planning is theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from aotforge.core.errors import UnsupportedModelError
from aotforge.core.spec import DimRange
from aotforge.targets import TARGETS
from aotforge.targets.base import Target


def check_model(
    model: Any, target: str = "tvm", target_options: Mapping[str, Any] | None = None, dynamic: Sequence[DimRange] = ()
) -> dict[str, Any]:
    """``{"direct": {op: count}, "rewritten": {step: ...}, "refused": [node, ...]}`` for ``model`` on ``target``."""
    from aotforge.compiler.builder import _declared_dims, _load
    from aotforge.compiler.options import BuildOptions
    from aotforge.core.dim_defaults import resolve_dims
    from aotforge.core.options import options_from_dict
    from aotforge.core.spec import check_dims_used
    from aotforge.targets import get_target

    chosen = get_target(target)
    if not has_coverage(chosen):
        checked = [n for n in TARGETS if has_coverage(get_target(n))]
        raise UnsupportedModelError(f"no op coverage check for target {target!r} yet (only {', '.join(checked)})")
    options = options_from_dict(chosen.options_type, dict(target_options or {}), what=target)
    opts = BuildOptions.from_fields({"target": target, "frontend.dynamic": tuple(dynamic), "benchmark.bench": False})
    source = _load(model, opts, None)  # the frontend, as a build runs it; no validation inputs are drawn
    io = dataclasses.replace(source.io, dims=_declared_dims(source.io, opts))
    check_dims_used(opts.frontend.dynamic, io)
    io = resolve_dims(io, io.dims, {})
    return chosen.coverage(source.ir, io, options) or {}


def has_coverage(target: Target) -> bool:
    """Whether ``target`` implements ``Target.coverage`` (the contract's default has no check)."""
    return type(target).coverage is not Target.coverage
