"""Default (search-free) CPU schedule rules for the ``tvm`` target, and a pass that reports them.

``apply_default_schedules(mod)`` must run inside ``with target:`` on a legalized, fused
module. It returns the scheduled module and a report: how many PrimFuncs each rule
scheduled, and which were left as plain loop nests.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.target import Target

from aotforge.targets.tvm.schedules.injective import Injective
from aotforge.targets.tvm.schedules.matmul import TiledMatmul
from aotforge.targets.tvm.schedules.pooling import WindowReduction
from aotforge.targets.tvm.schedules.reduction import FullReduction, RowReduction

RULE_ATTR = "aotforge.schedule_rule"


class _Tagged(dl.ScheduleRule):
    """Runs ``rule`` and tags the function it scheduled with the rule's name."""

    def __init__(self, name: str, rule: dl.ScheduleRule) -> None:
        self.name = name
        self.rule = rule

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        try:
            result = self.rule.apply(func, target, tunable)
        except Exception:  # a stock rule that crashes on a shape it does not expect
            return None
        if result is None:
            return None
        sch = result[0] if isinstance(result, list) else result
        try:  # re-wrapping also checks the result is well-formed TIR
            return s_tir.Schedule(sch.mod["main"].with_attr(RULE_ATTR, self.name))
        except Exception:
            return None


def default_rules() -> list[tuple[str, dl.ScheduleRule]]:
    """The rules in the order they are tried: the first that applies wins."""
    return [
        ("cpu.GEMV", dl.cpu.GEMV()),
        ("TiledMatmul", TiledMatmul()),
        ("WindowReduction", WindowReduction()),
        ("RowReduction", RowReduction()),
        ("FullReduction", FullReduction()),
        ("cpu.Reduction", dl.cpu.Reduction()),
        ("Injective", Injective()),
    ]


def apply_default_schedules(
    mod: Any, rules: list[tuple[str, dl.ScheduleRule]] | None = None
) -> tuple[Any, dict[str, Any]]:
    """Schedule every PrimFunc of ``mod`` a rule matches; report counts and the unmatched ones."""
    rules = default_rules() if rules is None else rules
    pre_scheduled = {
        gv.name_hint
        for gv, f in mod.functions_items()
        if isinstance(f, tirx.PrimFunc) and f.attrs is not None and int(f.attrs.get("tirx.is_scheduled", 0)) == 1
    }
    mod = dl.ApplyDefaultSchedule(*(_Tagged(name, rule) for name, rule in rules))(mod)
    counts = {name: 0 for name, _ in rules}
    unscheduled: list[str] = []
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint in pre_scheduled:
            continue
        rule = func.attrs.get(RULE_ATTR) if func.attrs is not None else None
        if rule is None:
            unscheduled.append(gv.name_hint)
        else:
            counts[str(rule)] += 1
    report = {
        "scheduled_by_rule": counts,
        "already_scheduled": len(pre_scheduled),
        "unscheduled": len(unscheduled),
        "unscheduled_funcs": sorted(unscheduled),
    }
    return mod, report
