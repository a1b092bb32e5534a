"""Clip (ReLU6, hard-tanh) as Relax ``maximum`` / ``minimum``, so layout conversion and fusion see it.

Neither form a frontend gives survives NHWC: the Relax ONNX importer lowers ``Clip`` straight to
TIR (``call_tir`` of topi's maximum / minimum, a ``T_maximum`` / ``T_minimum`` block against a
0-d bound), and the torch importer emits ``relax.clip``, which has no layout inference. Either way
``ConvertLayout`` wrapped every ReLU6 of a MobileNet in NHWC -> NCHW -> NHWC transposes, in a
kernel of its own. ``relax.maximum`` / ``relax.minimum`` against a 0-d bound compute the same
(topi's maximum / minimum) and fuse into the convolution's epilogue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotforge.targets.tvm.relax_util import op_name
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule, apply_rules

#: topi's block name -> the Relax op computing it.
_TOPI_BLOCKS = {"T_maximum": "maximum", "T_minimum": "minimum"}


def _number(bound: Any) -> float:
    """A ``relax.clip`` bound (a ``PrimValue`` of an int or float immediate) as a Python float."""
    value = bound.value
    return float(getattr(value, "value", value))


class ClipOp(Rule):
    """``relax.clip(x, lo, hi)`` (the torch importer's) -> ``minimum(maximum(x, lo), hi)``."""

    name = "relax.clip"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.clip"

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        x, lo, hi = call.args
        dtype = x.ty.dtype
        low = rw.builder_.normalize(relax.op.maximum(x, relax.const(_number(lo), dtype)))
        return relax.op.minimum(low, relax.const(_number(hi), dtype))


class TopiBound(Rule):
    """The ONNX importer's ``call_tir`` of topi's maximum / minimum against a 0-d bound -> the Relax op."""

    name = "onnx Clip"

    def __init__(self, mod: Any) -> None:
        self.mod = mod

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        from tvm import relax

        if op_name(call) != "relax.call_tir" or len(call.args) < 2:
            return False
        callee, args = call.args[0], call.args[1]
        return isinstance(callee, relax.GlobalVar) and isinstance(args, relax.Tuple) and len(args.fields) == 2

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        from tvm import s_tir, tirx

        func = self.mod[call.args[0]]
        if not isinstance(func, tirx.PrimFunc) or len(getattr(call.args[1].fields[1].ty, "shape", [None])) != 0:
            return MatchResult.fail("not an elementwise op against a 0-d bound")
        sch = s_tir.Schedule(func)
        names = [str(sch.get(b).name_hint) for b in sch.get_child_blocks(sch.get_sblock("root"))]
        if len(names) != 1 or names[0] not in _TOPI_BLOCKS:
            return MatchResult.fail("not topi's maximum / minimum")
        return MatchResult(_TOPI_BLOCKS[names[0]])

    def rewrite(self, call: Any, value: Any, rw: Rewriter) -> Any:
        from tvm import relax

        x, bound = call.args[1].fields
        return getattr(relax.op, value)(x, bound)


def clip_as_min_max(mod: Any) -> tuple[Any, dict[str, Any] | None]:
    """``mod`` with both forms of Clip rewritten; the report (``None`` when the graph has none)."""
    from tvm import relax

    mod, stats = apply_rules(mod, [ClipOp(), TopiBound(mod)])
    if not stats.applied:
        return mod, None
    # The topi kernels the importer made are unused now.
    return relax.transform.DeadCodeElimination()(mod), {"rewritten": dict(stats.applied)}
