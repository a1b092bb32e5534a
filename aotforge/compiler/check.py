"""``aotforge check``: what a target's importer takes of a model, in seconds, before any compile.

The model goes through the frontend (its IO spec and dim ranges, as a build resolves them) and the
target's pre-flight: for ``tvm`` the ONNX-level import steps (``targets/tvm/importable``) and the
importer's converter table, so every node it cannot take is named at once. Other targets have no
op-level check yet: the build's own planning is theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from aotforge.core.errors import UnsupportedModelError
from aotforge.core.spec import DimRange

#: Targets with an op-coverage check.
CHECKED = ("tvm",)


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

    if target not in CHECKED:
        raise UnsupportedModelError(f"no op coverage check for target {target!r} yet (only {', '.join(CHECKED)})")
    chosen = get_target(target)
    options = options_from_dict(chosen.options_type, dict(target_options or {}), what=target)
    opts = BuildOptions(target=target, dynamic=tuple(dynamic), bench=False)
    source = _load(model, opts, None)  # the frontend, as a build runs it; no validation inputs are drawn
    io = dataclasses.replace(source.io, dims=_declared_dims(source.io, opts))
    check_dims_used(opts.dynamic, io)
    io = resolve_dims(io, io.dims, {})
    from aotforge.targets.tvm.target import coverage_of

    return dict(coverage_of(source.ir, io, options).to_info())
