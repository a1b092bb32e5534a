"""NaN through ReLU / Max / Min / Clip as ONNX Runtime gives it, for ``--target-opt fast_math=false``.

TVM computes ``maximum`` / ``minimum`` (and ``relu``, a maximum with 0) as a compare and select:
``max(NaN, 0)`` is 0, so a NaN input left the tvm artifact as a finite value where ONNX Runtime,
and IEEE 754's ``maximum``, return NaN. This is not LLVM fast math (``exp`` of NaN stays NaN
either way). With ``fast_math=false`` each such call gets ``where(isnan(a), a, ...)`` for every
operand that is not a constant: elementwise, it fuses into the same kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aotforge.targets.tvm.relax_util import constant_value, op_name
from aotforge.targets.tvm.rewrites.rule import Rewriter, Rule, apply_rules

_OPS = ("relax.nn.relu", "relax.maximum", "relax.minimum")
#: Reductions (the ONNX importer's Max / Min of several inputs: stack, then max / min over axis 0).
_REDUCTIONS = ("relax.max", "relax.min")


class PropagateNan(Rule):
    name = "nan_propagating"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        if op_name(call) not in _OPS + _REDUCTIONS:
            return False
        dtype = str(getattr(call.args[0].ty, "dtype", ""))
        return dtype.startswith(("float", "bfloat"))

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        result = rw.builder_.normalize(call)
        if op_name(call) in _REDUCTIONS:  # NaN where any reduced element is NaN
            x = call.args[0]
            flags = rw.builder_.normalize(relax.op.astype(relax.op.isnan(x), "int8"))
            axis, keep = call.attrs.axis, call.attrs.keepdims
            any_nan = rw.builder_.normalize(relax.op.astype(relax.op.max(flags, axis, keep), "bool"))
            nan = relax.const(float("nan"), str(x.ty.dtype))
            return rw.builder_.normalize(relax.op.where(any_nan, nan, result))
        for operand in reversed(call.args):
            value = constant_value(rw.bound(operand))
            if value is not None and not np.isnan(value.astype(np.float32)).any():
                continue  # a bound (Clip's, a Max against 0) that is not NaN itself
            nan = rw.builder_.normalize(relax.op.isnan(operand))
            if tuple(operand.ty.shape) != tuple(result.ty.shape):
                operand = rw.builder_.normalize(relax.op.broadcast_to(operand, result.ty.shape))
                nan = rw.builder_.normalize(relax.op.broadcast_to(nan, result.ty.shape))
            result = rw.builder_.normalize(relax.op.where(nan, operand, result))
        return result


def propagate_nan(mod: Any) -> tuple[Any, dict[str, Any] | None]:
    """``mod`` with NaN-propagating max / min / relu; the report (None when the graph has none)."""
    mod, stats = apply_rules(mod, [PropagateNan()])
    return mod, ({"rewritten": dict(stats.applied)} if stats.applied else None)
