"""The base of aotforge's CPU schedule rules."""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target


class CpuRule(dl.ScheduleRule):
    """An LLVM-only rule; a schedule primitive that refuses means the function is not this rule's.

    Subclasses implement ``_apply(func, target)``, returning ``None`` for functions they do not match.
    """

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        try:
            return self._apply(func, target)  # type: ignore[attr-defined,no-any-return]
        except Exception:  # a schedule primitive refused: leave the function to the next rule
            return None
